"""Per-FedAvg: Hessian-vector products, the three meta-gradient variants, personalized
evaluation."""

import collections

import numpy as np
import pytest
import tensorflow as tf

from tff_comp import models
from tff_comp.ops import maml, model_ops
from tff_comp.tasks import personalization

RNG = np.random.default_rng(2)
RNG_SEED = 102  # each test's draws restart here (tests/conftest.py)
MODEL = models.mlp_regression((2, 5, 1), seed=1)
WEIGHTS = tuple(
  tf.constant(w + 0.1 * RNG.normal(size=w.shape), tf.float32) for w in MODEL.initial_weights[0]
)


def _batch(n=8):
  x = RNG.normal(size=(n, 2)).astype(np.float32)
  return tf.constant(x), tf.constant(np.sin(x[:, 0]) + x[:, 1] ** 2, tf.float32)


def _explicit_hessian_times(batch, vector):
  """Forms the full Hessian (small model) with nested tapes, then multiplies."""
  flat = tf.concat([tf.reshape(w, [-1]) for w in WEIGHTS], 0)
  shapes = [w.shape for w in WEIGHTS]
  sizes = [int(np.prod(s)) for s in shapes]

  def unflatten(v):
    return tuple(tf.reshape(p, s) for p, s in zip(tf.split(v, sizes), shapes))

  with tf.GradientTape() as outer:
    outer.watch(flat)
    with tf.GradientTape() as inner:
      inner.watch(flat)
      loss = model_ops.batch_loss(MODEL, unflatten(flat), (), batch)
    grad = inner.gradient(loss, flat)
  hessian = outer.jacobian(grad, flat)
  v = tf.concat([tf.reshape(x, [-1]) for x in vector], 0)
  return unflatten(tf.linalg.matvec(hessian, v))


def test_exact_hvp_equals_explicit_hessian_times_vector():
  batch = _batch()
  vector = tuple(tf.constant(RNG.normal(size=w.shape), tf.float32) for w in WEIGHTS)
  got = model_ops.hessian_vector_product(MODEL, WEIGHTS, (), batch, vector)
  want = _explicit_hessian_times(batch, vector)
  for a, b in zip(got, want):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_finite_difference_hvp_approaches_exact_as_delta_shrinks():
  # A smooth model: the ReLU MLP is piecewise linear, so differences across kinks
  # would not converge monotonically.
  model = models.softmax_regression(3, 4)
  weights = (
    tf.constant(RNG.normal(size=(3, 4)), tf.float32),
    tf.constant(RNG.normal(size=4), tf.float32),
  )
  batch = (
    tf.constant(RNG.normal(size=(10, 3)), tf.float32),
    tf.constant(RNG.integers(0, 4, 10), tf.int32),
  )
  vector = tuple(tf.constant(RNG.normal(size=w.shape), tf.float32) for w in weights)
  exact = model_ops.hessian_vector_product(model, weights, (), batch, vector)

  def error(delta):
    approx = model_ops.finite_difference_hvp(model, weights, (), batch, vector, delta)
    return float(tf.add_n([tf.reduce_sum(tf.square(a - b)) for a, b in zip(approx, exact)]))

  errors = [error(d) for d in (0.3, 0.1, 0.03)]
  assert errors[0] > errors[1] > errors[2]
  assert errors[2] < 1e-2 * errors[0] + 1e-6


@pytest.mark.parametrize('variant', ['fo', 'exact', 'hf'])
def test_meta_gradient_variants(variant):
  alpha = 0.05
  rule = maml.PerFedAvg(MODEL, learning_rate=0.1, alpha=alpha, variant=variant, delta=1e-2)
  hparams = collections.OrderedDict((k, tf.constant(v)) for k, v in rule.initial_hparams().items())
  batches = (_batch(), _batch(), _batch())
  _, got = rule.meta_gradient(WEIGHTS, batches, hparams, ())
  _, g = model_ops.batch_loss_and_gradient(MODEL, WEIGHTS, (), batches[0])
  adapted = tuple(w - alpha * x for w, x in zip(WEIGHTS, g))
  _, outer = model_ops.batch_loss_and_gradient(MODEL, adapted, (), batches[1])
  hv = _explicit_hessian_times(batches[2], outer)
  want = outer if variant == 'fo' else tuple(o - alpha * h for o, h in zip(outer, hv))
  tolerance = 1e-4 if variant != 'hf' else 2e-2
  for a, b in zip(got, want):
    np.testing.assert_allclose(a, b, rtol=tolerance, atol=tolerance)


def test_personalized_evaluation_adapts_by_gradient_steps():
  model = models.linear_regression((1,))
  x = np.array([[1.0], [2.0]], np.float32)
  y = np.array([2.0, 4.0], np.float32)
  clients = [(x, y, x, y)]
  zero = (np.zeros([1], np.float32), np.float32(0.0))
  same = personalization.personalized_losses(model, zero, clients, alpha=0.0, steps=1)
  assert same['loss_before'] == same['loss_after'] == pytest.approx(0.5 * (4 + 16) / 2)
  one = personalization.personalized_losses(model, zero, clients, alpha=0.1, steps=1)
  # one step: w = 0.1 * mean(x y) = 0.5, b = 0.1 * mean(y) = 0.3
  want = 0.5 * np.mean((x[:, 0] * 0.5 + 0.3 - y) ** 2)
  assert one['loss_after'] == pytest.approx(want, rel=1e-5)
  assert one['worst_loss_after'] == pytest.approx(want, rel=1e-5)
