"""Side channels are aggregated exactly beside a clipped, compressed or noised delta;
unweighted (DP) model aggregators compose where the math is a uniform mean."""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tests import algorithm_cases
from tff_comp import registry
from tff_comp.learning_process import aggregation_factories
from tff_comp.ops import messages, update_aggregation

INNER = {
  'clipping': lambda: tff.learning.robust_aggregator(zeroing=False),
  'compression': lambda: tff.learning.compression_aggregator(zeroing=False),
  'dp': lambda: tff.learning.dp_aggregator(noise_multiplier=0.1, clients_per_round=10),
}
# Three clients; deltas far beyond the clipping norms (1.0 at the start).
DELTAS = [
  np.array([100.0, -200.0], np.float32),
  np.array([-300.0, 50.0], np.float32),
  np.array([20.0, 20.0], np.float32),
]
WEIGHTS = [1.0, 1.0, 1.0]  # uniform (DP factories are unweighted)
SIDE = [np.float32(2.0), np.float32(6.0), np.float32(1.0)]
DELTA_SPEC = (tf.TensorSpec([2], tf.float32),)


def _aggregate(kind, update_class, side_field, side_spec, inner, sides):
  value_type = tff.types.tensorflow_to_type(
    update_class(delta=DELTA_SPEC, **{side_field: side_spec})
  )
  process = aggregation_factories.factory_for(kind, inner).create(
    value_type, tff.TensorType(np.float32)
  )
  values = [update_class((d,), **{side_field: s}) for d, s in zip(DELTAS, sides)]
  return process.next(process.initialize(), values, [np.float32(w) for w in WEIGHTS])


@pytest.mark.parametrize('inner', sorted(INNER))
def test_side_channels_are_exact_beside_any_inner_aggregator(inner):
  # FedDualAvg / FedMiD: the mean sum of eta_c.
  out = _aggregate(
    update_aggregation.MEAN,
    messages.ElapsedUpdate,
    'lr_sum',
    tf.TensorSpec([], tf.float32),
    INNER[inner](),
    SIDE,
  )
  assert float(out.result.lr_sum) == pytest.approx(np.mean(SIDE), rel=1e-6)
  assert np.abs(out.result.delta[0]).max() < 50  # the delta itself was clipped/noised
  # FedNova: tau_eff = mean ||a_i||_1.
  out = _aggregate(
    update_aggregation.NORMALIZED,
    messages.NormalizedUpdate,
    'a_norm',
    tf.TensorSpec([], tf.float32),
    INNER[inner](),
    SIDE,
  )
  assert float(out.measurements['tau_eff']) == pytest.approx(np.mean(SIDE), rel=1e-6)
  # AFL / TR-MAML: each client's loss in its own slot, summed.
  slots = [np.eye(3, dtype=np.float32)[i] * (i + 5.0) for i in range(3)]
  out = _aggregate(
    update_aggregation.SLOTS,
    messages.SlotLossUpdate,
    'losses',
    tf.TensorSpec([3], tf.float32),
    INNER[inner](),
    slots,
  )
  np.testing.assert_array_equal(out.result.losses, [5.0, 6.0, 7.0])


def test_feddualavg_elapsed_coefficient_is_unchanged_by_a_robust_aggregator():
  """The elapsed coefficient c moves the prox threshold: clipping must not touch it."""
  data = algorithm_cases.DATA['unequal']
  states = []
  for inner in (None, tff.learning.robust_aggregator()):
    process = algorithm_cases.build(
      'feddualavg', dict(model_aggregator=inner, client_learning_rate=0.5)
    )
    runner = tff.simulation.compose_dataset_computation_with_learning_process(
      data.dataset_computation, process
    )
    state = runner.initialize()
    for r in range(3):
      state = runner.next(state, data.client_ids[r : r + 3]).state
    states.append(state)
  plain, robust = (s.finalizer.elapsed for s in states)
  assert float(plain) > 0 and float(robust) == pytest.approx(float(plain), rel=1e-6)
  moved = [np.asarray(s.global_model_weights.trainable[0]) for s in states]
  assert not np.allclose(*moved)  # the robust aggregator did change the model update


@pytest.mark.parametrize(
  'name,extra,message',
  [
    ('fedavg', {}, "client_weighting='uniform'"),
    ('afl', {}, 'per-client weights'),
    ('tr_maml', {}, 'per-client weights'),
    ('local_scgdm', {}, 'un-noised'),
    ('ditto', dict(client_weighting='uniform'), 'un-noised'),
  ],
)
def test_unweighted_model_aggregator_is_refused_where_the_math_is_weighted(name, extra, message):
  with pytest.raises(ValueError, match=message):
    algorithm_cases.build(name, dict(extra, model_aggregator=INNER['dp']()))


@pytest.mark.parametrize('name', ['fedavg', 'fednova', 'feddualavg', 'qfedavg'])
def test_unweighted_model_aggregator_composes_with_uniform_weights(name):
  extra = dict(model_aggregator=tff.aggregators.UnweightedMeanFactory())
  if registry.get_algorithm(name).accepts('client_weighting'):
    extra['client_weighting'] = 'uniform'
  unweighted = algorithm_cases.build(name, extra)
  weighted = algorithm_cases.build(
    name, {k: v for k, v in extra.items() if k != 'model_aggregator'}
  )
  data = algorithm_cases.DATA['unequal']
  finals = []
  for process in (unweighted, weighted):
    runner = tff.simulation.compose_dataset_computation_with_learning_process(
      data.dataset_computation, process
    )
    state = runner.initialize()
    for r in range(2):
      state = runner.next(state, data.client_ids[r : r + 3]).state
    finals.append(process.get_model_weights(state).trainable)
  for a, b in zip(*finals):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
