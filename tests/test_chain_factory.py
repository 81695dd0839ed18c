"""`ops.aggregators` chains placed as `tff.aggregators` factories (learning_process.
chain_factory) against TFF's own factories and NumPy, and in a genuine TFF process."""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tests import algorithm_cases, numpy_reference
from tff_comp import experiment
from tff_comp.algorithms import fedavg
from tff_comp.learning_process import chain_factory
from tff_comp.ops import aggregators as agg
from tff_comp.runtime import inprocess, tff_process

VALUE_TYPE = tff.to_type(
  collections.OrderedDict(a=tff.TensorType(np.float32, [3]), b=tff.TensorType(np.float32, [2, 2]))
)
WEIGHT_TYPE = tff.TensorType(np.float32)


def _cohort(seed: int, m: int = 7, scale: float = 1.0):
  rng = np.random.default_rng(seed)
  values = [
    collections.OrderedDict(
      a=(scale * rng.normal(size=3) * rng.uniform(0.1, 3)).astype(np.float32),
      b=(scale * rng.normal(size=(2, 2))).astype(np.float32),
    )
    for _ in range(m)
  ]
  weights = rng.integers(1, 5, size=m).astype(np.float32).tolist()
  return values, weights


def _rows(values) -> np.ndarray:
  return np.stack([np.concatenate([v['a'], v['b'].ravel()]) for v in values])


def _flat(result) -> np.ndarray:
  return np.concatenate([np.asarray(result['a']), np.asarray(result['b']).ravel()])


def _rounds(factory, rounds=3, **cohort):
  """The factory's results over `rounds` rounds of fresh cohorts."""
  process = factory.create(VALUE_TYPE, WEIGHT_TYPE)
  state, results = process.initialize(), []
  for r in range(rounds):
    out = process.next(state, *_cohort(r, **cohort))
    state = out.state
    results.append(_flat(out.result))
  return results


@pytest.mark.parametrize(
  'chain, theirs',
  [
    (
      agg.Chain((agg.Clip(1.5),), agg.Mean()),
      lambda: tff.aggregators.clipping_factory(1.5, tff.aggregators.MeanFactory()),
    ),
    (
      agg.Chain((agg.Zeroing(2.0, order=2.0),), agg.Mean()),
      lambda: tff.aggregators.zeroing_factory(2.0, tff.aggregators.MeanFactory(), norm_order=2.0),
    ),
    (
      agg.Chain((agg.Clip(1.0, adaptive=agg.Quantile(target=0.7, learning_rate=0.3)),), agg.Mean()),
      lambda: tff.aggregators.clipping_factory(
        tff.aggregators.PrivateQuantileEstimationProcess.no_noise(
          1.0, target_quantile=0.7, learning_rate=0.3
        ),
        tff.aggregators.MeanFactory(),
      ),
    ),
  ],
  ids=['clip', 'zeroing', 'adaptive-clip'],
)
def test_a_chain_equals_tffs_own_factory(chain, theirs):
  ours = _rounds(chain_factory.ChainFactory(chain), rounds=4)
  reference = _rounds(theirs(), rounds=4)
  np.testing.assert_allclose(ours, reference, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
  'chain, numpy_of',
  [
    (agg.Chain((), agg.Median()), lambda x: np.median(x, 0)),
    (
      agg.Chain((), agg.TrimmedMean(0.2)),  # 7 rows: one trimmed at each end
      lambda x: np.sort(x, 0)[1:-1].mean(0),
    ),
    (
      agg.Chain((), agg.Median(), agg.NearestNeighbourMixing(2)),
      lambda x: np.median(numpy_reference.nnm(x, 2), 0),
    ),
  ],
  ids=['median', 'trimmed-mean', 'nnm-median'],
)
def test_a_combiner_needing_every_row_gathers_them(chain, numpy_of):
  process = chain_factory.ChainFactory(chain).create(VALUE_TYPE, WEIGHT_TYPE)
  values, weights = _cohort(5)
  out = process.next(process.initialize(), values, weights)
  np.testing.assert_allclose(_flat(out.result), numpy_of(_rows(values)), rtol=1e-6)


@pytest.mark.parametrize(
  'chain, says',
  [
    (
      agg.Chain((agg.ErrorFeedback(agg.TopK(0.5)),), agg.Mean()),
      "keeps a row per client (error feedback, worker momentum), which TFF's stateless"
      ' clients cannot hold',
    ),
    (
      agg.Chain((agg.ALIE(0.3),), agg.Median()),
      'reads the whole cohort',
    ),
  ],
)
def test_what_tffs_clients_cannot_hold_is_refused_in_one_line(chain, says):
  with pytest.raises(ValueError) as error:
    chain_factory.ChainFactory(chain)
  assert says in str(error.value) and '\n' not in str(error.value)


def test_build_fedavg_with_a_chain_is_a_tff_process_equal_to_the_inprocess_runtime():
  """`build_fedavg(model_aggregator=chain)` composes a genuine TFF process whose rounds
  on TFF's runtime equal the in-process runtime's (a deterministic chain: the two draw
  per-client seeds differently)."""
  chain = agg.Chain((agg.Clip(0.05), agg.TopK(0.5)), agg.Krum(1, select=2))
  process = fedavg.build_fedavg(
    algorithm_cases.MODEL,
    client_learning_rate=0.02,
    batch_size=3,
    client_weighting='uniform',
    model_aggregator=chain,
  )
  assert isinstance(process, tff.learning.templates.LearningProcess)
  data = algorithm_cases.DATA['unequal']
  fast = inprocess.build(process, data, engine='mapped')
  slow = tff.simulation.compose_dataset_computation_with_learning_process(
    tff_process.dataset_computation_for(process, data), process
  )
  fast_state, slow_state = fast.initialize(), slow.initialize()
  for ids in (data.client_ids, data.client_ids[1:4]):
    fast_out, slow_out = fast.next(fast_state, ids), slow.next(slow_state, ids)
    fast_state, slow_state = fast_out.state, slow_out.state
    measured = slow_out.metrics['aggregator']
    assert measured['krum_selected'] == 2
    assert measured['clipped_count'] == fast_out.metrics['aggregator']['clipped_count'] > 0
  ours = fast.get_model_weights(fast_state).trainable
  theirs = process.get_model_weights(slow_state).trainable
  assert np.abs(np.asarray(ours[0])).max() > 1e-3  # the model moved
  for a, b in zip(tf.nest.flatten(ours), tf.nest.flatten(theirs), strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_tffs_runtime_refuses_error_feedback_in_one_line(tmp_path):
  prepared = experiment.prepare(
    experiment.ExperimentConfig.of(
      algorithm='fedavg',
      task='quadratic',
      runtime='tff',
      compression='top_k',
      error_feedback='ef',
      output_dir=str(tmp_path),
    )
  )
  with pytest.raises(experiment.ConfigError) as error:
    experiment.build_runner(prepared)
  assert str(error.value).startswith('--runtime=tff: aggregator ef(top_k)+mean keeps a row')
  assert '\n' not in str(error.value)
