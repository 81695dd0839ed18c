"""Lockstep lanes (`runtime.lanes`) give each client exactly `protocol.run_client`'s
output, whatever the lane count, and compile once for every cohort."""

import collections

import numpy as np
import pytest
import tensorflow as tf

from tff_comp import models
from tff_comp.ops import local_loop
from tff_comp.ops import protocol
from tff_comp.ops import rule as rule_lib
from tff_comp.ops import sgd
from tff_comp.runtime import lanes

D = 3
MODEL = models.linear_regression((D,))
# Sizes around the batch size 4: an empty client, clients with no full batch, with
# and without a short last batch.
SIZES = [9, 0, 3, 12, 1, 7, 4, 5]


def _data():
  rng = np.random.default_rng(0)
  x = rng.normal(size=(sum(SIZES), D)).astype(np.float32)
  y = (x @ np.array([1.0, -2.0, 0.5], np.float32) + 0.1).astype(np.float32)
  return (tf.constant(x), tf.constant(y))


_Weights = collections.namedtuple('Weights', 'trainable non_trainable')  # no TFF


def _setup(momentum: float, epochs: int):
  rule = sgd.SGD(MODEL, learning_rate=0.05, momentum=momentum, proximal_strength=0.1)
  options = protocol.ClientOptions(batch_size=4, local_epochs=epochs)
  payload = _Weights((tf.constant([0.3, -0.1, 0.2]), tf.constant(0.05)), ())
  hparams = {k: tf.constant(v, tf.float32) for k, v in rule.initial_hparams().items()}
  return rule, options, payload, hparams


def _expected(rule, options, payload, hparams, examples, cohort):
  offsets = np.cumsum(SIZES) - SIZES
  outs = []
  for c in cohort:
    client = tf.nest.map_structure(lambda t: t[offsets[c]:offsets[c] + SIZES[c]], examples)
    outs.append(protocol.run_client(rule, payload, client, hparams,
                                    rule_lib.RoundContext.of(client_index=c), options,
                                    tf.constant(0)))
  return outs


def _kernel(rule, options, examples, width):
  remainders = sorted({options.local_epochs * n % protocol.step_batch_size(rule, options)
                       for n in SIZES} - {0})

  def kernel(payload, hparams, offsets, counts, plans):
    return lanes.run_cohort(rule, payload, hparams, options, examples, offsets, counts,
                            plans, lanes=width, remainders=remainders)

  return kernel


def _cohort_args(rule, options, cohort):
  """(offsets, counts, plans) of `cohort`, as the in-process runtime makes them."""
  counts = tf.constant([SIZES[c] for c in cohort], tf.int32)
  offsets = tf.constant([int(np.sum(SIZES[:c])) for c in cohort], tf.int32)
  full, remainder = local_loop.schedule(
      counts, batch_size=protocol.step_batch_size(rule, options),
      epochs=options.local_epochs)
  m = len(cohort)
  context = rule_lib.RoundContext(tf.constant(cohort, tf.int32), tf.zeros([m]),
                                  tf.zeros([m]))
  return offsets, counts, protocol.ClientPlan(context, full, remainder)


@pytest.mark.parametrize('width', [1, 3, 8])
@pytest.mark.parametrize('momentum,epochs', [(0.0, 1), (0.5, 2)])
def test_each_client_gets_run_clients_output(width, momentum, epochs):
  rule, options, payload, hparams = _setup(momentum, epochs)
  examples = _data()
  cohort = [3, 1, 0, 4, 2, 6, 5, 7]
  stacked = _kernel(rule, options, examples, width)(
      payload, hparams, *_cohort_args(rule, options, cohort))
  for i, expected in enumerate(_expected(rule, options, payload, hparams, examples, cohort)):
    got = tf.nest.map_structure(lambda t: t[i], stacked)
    for a, b in zip(tf.nest.flatten(got), tf.nest.flatten(expected)):
      np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-6)
  # The empty client (index 1 in the data, position 1 here) took no step, weighs 0.
  assert float(stacked.stats['num_steps'][1]) == 0.0
  assert float(stacked.weight[1]) == 0.0


def test_compiled_once_for_every_cohort():
  """XLA bakes a tensor used as a slice index into the program as a constant, so a
  kernel that indexed by client would compile again for every new cohort (seconds per
  round). The program must not depend on which clients a round holds."""
  rule, options, payload, hparams = _setup(0.0, 1)
  examples = _data()
  compiled = tf.function(_kernel(rule, options, examples, 2), jit_compile=True)
  programs = []
  for cohort in ([0, 2, 3], [5, 6, 7]):
    args = (payload, hparams, *_cohort_args(rule, options, cohort))
    expected = _expected(rule, options, payload, hparams, examples, cohort)
    np.testing.assert_allclose(compiled(*args).weight.numpy(),
                               [e.weight for e in expected])
    programs.append(compiled.experimental_get_compiler_ir(*args)(stage='hlo'))
  assert programs[0] == programs[1]
