"""Prox operators against closed forms and a numerical minimization (no TFF)."""

import numpy as np
import pytest
from scipy import optimize
import tensorflow as tf

from tff_comp.ops import regularizers

RNG = np.random.default_rng(0)


def _prox(reg, z, t):
  return reg.prox([tf.constant(z, tf.float32)], t)[0].numpy()


def _numerical_prox(psi_value, z, t):
  """argmin_w 0.5||w - z||^2 + t psi(w) by direct minimization from many starts."""
  shape = z.shape
  objective = lambda w: 0.5 * np.sum((w - z.ravel()) ** 2) + t * psi_value(w.reshape(shape))
  best = None
  for start in [z.ravel(), np.zeros(z.size), RNG.normal(size=z.size)]:
    res = optimize.minimize(
      objective, start, method='Powell', options=dict(xtol=1e-10, ftol=1e-14, maxiter=100000)
    )
    if best is None or res.fun < best.fun:
      best = res
  return best.x.reshape(shape), best.fun, objective


@pytest.mark.parametrize('t', [0.1, 0.7])
def test_l1_prox_is_soft_threshold_and_minimizes(t):
  z = RNG.normal(size=5).astype(np.float32)
  reg = regularizers.L1(strength=0.8)
  got = _prox(reg, z, t)
  np.testing.assert_allclose(got, np.sign(z) * np.maximum(np.abs(z) - 0.8 * t, 0), atol=1e-6)
  _, best, objective = _numerical_prox(lambda w: 0.8 * np.abs(w).sum(), z, t)
  assert objective(got.ravel()) <= best + 1e-6


def test_squared_l2_prox():
  z = RNG.normal(size=4).astype(np.float32)
  reg = regularizers.SquaredL2(strength=2.0)
  np.testing.assert_allclose(_prox(reg, z, 0.5), z / 2.0, rtol=1e-6)
  w, _, _ = _numerical_prox(lambda w: np.sum(w**2), z, 0.5)
  np.testing.assert_allclose(_prox(reg, z, 0.5), w, atol=1e-4)


def test_nuclear_prox_thresholds_singular_values_and_minimizes():
  z = RNG.normal(size=(3, 2)).astype(np.float32)
  reg = regularizers.Nuclear(strength=0.6)
  got = _prox(reg, z, 1.0)
  u, s, vt = np.linalg.svd(z, full_matrices=False)
  np.testing.assert_allclose(got, (u * np.maximum(s - 0.6, 0)) @ vt, atol=1e-5)
  nuclear = lambda w: 0.6 * np.linalg.svd(w, compute_uv=False).sum()
  _, best, objective = _numerical_prox(nuclear, z, 1.0)
  assert objective(got.ravel()) <= best + 1e-5


def test_l2_ball_projection():
  z = np.array([3.0, 4.0], np.float32)
  reg = regularizers.L2Ball(strength=1.0)
  np.testing.assert_allclose(_prox(reg, z, 123.0), [0.6, 0.8], rtol=1e-6)
  inside = np.array([0.1, 0.2], np.float32)
  np.testing.assert_allclose(_prox(reg, inside, 1.0), inside)


@pytest.mark.parametrize('radius', [0.5, 2.0, 10.0])
def test_l1_ball_projection_matches_constrained_minimization(radius):
  z = (3 * RNG.normal(size=6)).astype(np.float32)
  reg = regularizers.L1Ball(strength=radius)
  got = _prox(reg, z, 1.0)
  assert np.abs(got).sum() <= radius * (1 + 1e-5)
  # The projection as a smooth QP in w = p - n (p, n >= 0, sum(p + n) <= r), which SLSQP
  # solves exactly in a few steps (|w| in the constraint took it 20 s).
  d = z.size
  residual = lambda v: v[:d] - v[d:] - z
  res = optimize.minimize(
    lambda v: 0.5 * np.sum(residual(v) ** 2),
    np.zeros(2 * d),
    jac=lambda v: np.concatenate([residual(v), -residual(v)]),
    method='SLSQP',
    bounds=[(0, None)] * (2 * d),
    constraints=[dict(type='ineq', fun=lambda v: radius - v.sum(), jac=lambda v: -np.ones(2 * d))],
    options=dict(ftol=1e-14, maxiter=1000),
  )
  np.testing.assert_allclose(got, res.x[:d] - res.x[d:], atol=1e-4)


def test_prox_touches_only_targets_and_none_is_identity():
  kernel, bias = np.ones((2, 2), np.float32), np.ones(2, np.float32)
  out = regularizers.L1(strength=5.0, targets=(0,)).prox([kernel, bias], 1.0)
  np.testing.assert_allclose(out[0], 0.0)
  np.testing.assert_allclose(out[1], bias)
  same = regularizers.NoRegularizer().prox([kernel, bias], 3.0)
  np.testing.assert_allclose(same[0], kernel)


def test_values_and_subgradients():
  w = np.array([1.0, -2.0, 0.0], np.float32)
  assert regularizers.L1(strength=0.5).value([w]).numpy() == pytest.approx(1.5)
  np.testing.assert_allclose(regularizers.L1(strength=0.5).subgradient([w])[0], [0.5, -0.5, 0])
  assert regularizers.SquaredL2(strength=2.0).value([w]).numpy() == pytest.approx(5.0)
  assert np.isinf(regularizers.L2Ball(strength=1.0).value([w]).numpy())


def test_bad_input():
  with pytest.raises(ValueError, match='strength must be >= 0'):
    regularizers.L1(strength=-1.0)
  with pytest.raises(ValueError, match='unknown'):
    regularizers.make_regularizer('l3')
  with pytest.raises(ValueError, match='needs a matrix'):
    regularizers.Nuclear(strength=1.0).check_applies_to([(5,)])
  with pytest.raises(ValueError, match='does not exist'):
    regularizers.L1(strength=1.0, targets=(3,)).check_applies_to([(5,)])


def test_l1_ball_of_radius_zero_projects_to_zero():
  """Radius 0 used to crash (gather index -1); the projection onto {0} is 0."""
  z = tf.constant([[0.5, -2.0], [0.0, 1.0]])
  np.testing.assert_array_equal(regularizers.project_l1_ball(z, 0.0), np.zeros((2, 2)))
  np.testing.assert_allclose(regularizers.project_l1_ball(z, 1.0), [[0, -1], [0, 0]])
