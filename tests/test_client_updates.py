"""Client rules in pure TensorFlow against the NumPy reference (no TFF execution)."""

import collections

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tests import numpy_reference as ref
from tff_comp import models
from tff_comp.ops import composite, local_loop, messages, regularizers, sgd
from tff_comp.ops import rule as rule_lib

D = 6
RNG = np.random.default_rng(1)
RNG_SEED = 101  # each test's draws restart here (tests/conftest.py)
X = RNG.normal(size=(17, D)).astype(np.float32)
Y = (X @ RNG.normal(size=D) + 0.3).astype(np.float32)
MODEL = models.linear_regression((D,))
HP = collections.OrderedDict(learning_rate=tf.constant(0.05))


def _run(rule, payload, hparams=HP, batch_size=4):
  context = rule_lib.RoundContext.of()
  state = rule.initialize(payload, hparams, context)
  batches = local_loop.plan(len(X), 0, 0, batch_size=batch_size)
  state = local_loop.run_scheduled_steps(
    lambda s, b: rule.step(s, b, payload, hparams, context),
    state,
    (X, Y),
    batches,
    batch_size=batch_size,
  )
  return state, rule.finalize(state, payload, hparams, context)


def _weights(w, b):
  return tff.learning.models.ModelWeights((tf.constant(w), tf.constant(b)), ())


def test_sgd_matches_manual_and_fedprox_adds_proximal_term():
  w0, b0 = RNG.normal(size=D).astype(np.float32), np.float32(0.2)
  for mu in (0.0, 0.5):
    rule = sgd.SGD(MODEL, learning_rate=0.05, proximal_strength=mu)
    hp = collections.OrderedDict((k, tf.constant(v)) for k, v in rule.initial_hparams().items())
    state, update = _run(rule, _weights(w0, b0), hp)
    w, b = w0.copy(), b0
    for xb, yb in ref.batches(X, Y, 4):
      gw, gb = ref.gradient(w, b, xb, yb)
      w, b = w - 0.05 * (gw + mu * (w - w0)), b - 0.05 * (gb + mu * (b - b0))
    np.testing.assert_allclose(state.weights[0], w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(update[0], w0 - w, rtol=1e-4, atol=1e-6)
    assert int(state.examples) == 17


def test_proximal_sgd_matches_reference():
  w0 = RNG.normal(size=D).astype(np.float32)
  l1 = regularizers.L1(strength=0.4)
  rule = composite.ProximalSGD(MODEL, learning_rate=0.05, regularizer=l1)
  _, update = _run(rule, _weights(w0, np.float32(0.0)))
  w, b = w0.copy(), 0.0
  for xb, yb in ref.batches(X, Y, 4):
    gw, gb = ref.gradient(w, b, xb, yb)
    w, b = ref.soft_threshold(w - 0.05 * gw, 0.05 * 0.4), b - 0.05 * gb
  np.testing.assert_allclose(update.delta[0], w0 - w, atol=1e-6)
  np.testing.assert_allclose(update.lr_sum, 0.05 * 5, rtol=1e-6)


def test_dual_averaging_matches_reference_from_a_nonzero_elapsed():
  z0 = RNG.normal(size=D).astype(np.float32)
  l1 = regularizers.L1(strength=0.4)
  rule = composite.DualAveraging(MODEL, learning_rate=0.05, regularizer=l1)
  payload = messages.DualPayload(_weights(z0, np.float32(0.1)), tf.constant(0.7))
  _, update = _run(rule, payload)
  z, zb, own = z0.copy(), 0.1, 0.0
  for xb, yb in ref.batches(X, Y, 4):
    w = ref.soft_threshold(z, (0.7 + own) * 0.4)
    gw, gb = ref.gradient(w, zb, xb, yb)
    z, zb, own = z - 0.05 * gw, zb - 0.05 * gb, own + 0.05
  np.testing.assert_allclose(update.delta[0], z0 - z, atol=1e-6)
  np.testing.assert_allclose(update.delta[1], 0.1 - zb, atol=1e-6)
