"""The local step's terms as gradient transforms (`ops.gradient_transforms`), against the
update rules written out in NumPy."""

import numpy as np
import tensorflow as tf

from tff_comp.ops import gradient_transforms as gt

W0 = (np.array([1.0, -2.0], np.float32), np.array(0.5, np.float32))
HPARAMS = {'proximal_strength': tf.constant(0.3), 'momentum': tf.constant(0.9)}


class _Payload:
  control = (np.array([0.1, 0.2], np.float32), np.array(-0.4, np.float32))
  controls = (np.array([[0.0, 0.0], [0.5, -0.5]], np.float32), np.array([0.0, 1.0], np.float32))


def _steps(transforms, grads_of, steps=3, lr=0.1):
  weights = tuple(tf.constant(w) for w in W0)
  states = gt.init(transforms, weights, _Payload())
  for _ in range(steps):
    direction, states = gt.chain(
      transforms, grads_of(weights), weights, states, HPARAMS, tuple(tf.constant(w) for w in W0)
    )
    weights = tuple(w - lr * d for w, d in zip(weights, direction))
  return [w.numpy() for w in weights]


def _grad(weights):
  return tuple(2.0 * w for w in weights)  # f(w) = ||w||^2


def test_proximal_then_momentum_is_fedprox_with_heavy_ball():
  transforms = (gt.Proximal(0.3), gt.Momentum(0.9))
  assert {**transforms[0].hparams, **transforms[1].hparams} == {
    'proximal_strength': 0.3,
    'momentum': 0.9,
  }
  w, v = [np.copy(x) for x in W0], [np.zeros_like(x) for x in W0]
  for _ in range(3):  # v <- rho v + (g + mu (w - w0)); w <- w - eta v
    v = [0.9 * vi + (2.0 * wi + 0.3 * (wi - w0)) for vi, wi, w0 in zip(v, w, W0)]
    w = [wi - 0.1 * vi for wi, vi in zip(w, v)]
  for got, want in zip(_steps((gt.Proximal(0.3), gt.Momentum(0.9)), _grad), w):
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_control_variate_adds_c_minus_own_row():
  transform = gt.ControlVariate()
  state = transform.correct(_Payload(), tf.constant(1))
  np.testing.assert_allclose(state.own[0], [0.5, -0.5])
  np.testing.assert_allclose(state.correction[0], [0.1 - 0.5, 0.2 + 0.5], rtol=1e-6)
  np.testing.assert_allclose(state.correction[1], -0.4 - 1.0, rtol=1e-6)
  direction, _ = gt.chain((transform,), _grad(W0), W0, {'control_variate': state}, HPARAMS, W0)
  np.testing.assert_allclose(direction[0], 2.0 * W0[0] + np.array([-0.4, 0.7]), rtol=1e-6)


def test_no_transform_is_plain_sgd():
  w = [np.copy(x) for x in W0]
  for _ in range(3):
    w = [wi - 0.1 * 2.0 * wi for wi in w]
  for got, want in zip(_steps((), _grad), w):
    np.testing.assert_allclose(got, want, rtol=1e-6)
