"""Pre-aggregations (rows mixed before a robust combiner): nearest-neighbour mixing against
NumPy written from Allouah et al. 2023, in a chain and from the command line's settings
(`--pre_aggregation`, a setting shared with the combiners)."""

import numpy as np
import pytest
import tensorflow as tf

from tests import numpy_reference
from tff_comp import settings
from tff_comp.config import aggregation_settings, experiment_config
from tff_comp.ops import aggregators as agg


@pytest.mark.parametrize('m, f', [(10, 2), (7, 0), (5, 4), (3, 5)])
def test_nnm_is_the_mean_of_each_rows_m_minus_f_nearest(m, f):
  rng = np.random.default_rng(m * 10 + f)
  x = rng.normal(size=(m, 6)).astype(np.float32)
  x[0] += 5.0  # one far row
  weights = np.ones(m, np.float32)
  mixed, w = agg.NearestNeighbourMixing(f).mix(tf.constant(x), tf.constant(weights), None)
  np.testing.assert_allclose(mixed.numpy(), numpy_reference.nnm(x, f), rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(w.numpy(), weights)


def test_nnm_keeps_a_non_finite_row_out_of_the_finite_rows_neighbourhoods():
  rng = np.random.default_rng(1)
  x = rng.normal(size=(8, 5)).astype(np.float32)
  bad = x.copy()
  bad[3] = np.nan
  mixed = agg.NearestNeighbourMixing(2).mix(tf.constant(bad), tf.ones(8), None)[0].numpy()
  honest = np.delete(x, 3, 0)
  # Each finite row mixes its 6 nearest among the 7 finite ones; the NaN row stays NaN.
  np.testing.assert_allclose(np.delete(mixed, 3, 0), numpy_reference.nnm(honest, 1), rtol=1e-5)
  assert np.isnan(mixed[3]).all()


def test_a_chain_mixes_before_its_combiner_and_refuses_a_mean():
  rng = np.random.default_rng(2)
  x = rng.normal(size=(9, 4)).astype(np.float32)
  chain = agg.Chain((), agg.Median(), agg.NearestNeighbourMixing(2))
  assert chain.name == 'nnm+median'
  update, *_ = chain.aggregate(
    chain.initial_state(),
    tf.constant(x),
    tf.ones(9),
    tf.zeros([9, 0]),
    agg.base.client_seeds(0, 1, tf.range(9)),
    agg.base.round_seed(0, 1),
  )
  np.testing.assert_allclose(update.numpy(), np.median(numpy_reference.nnm(x, 2), 0), rtol=1e-5)
  with pytest.raises(ValueError, match='mixes every row, and combiner mean reads only'):
    agg.Chain((), agg.Mean(), agg.NearestNeighbourMixing(1))


def test_the_pre_aggregation_flag_builds_the_chain_and_shares_f_with_the_combiners():
  options = aggregation_settings.AggregationOptions(
    aggregator='krum', pre_aggregation='nnm', byzantine_clients=2
  )
  chain = options.chain(None, 10)
  assert isinstance(chain.pre_aggregation, agg.NearestNeighbourMixing)
  assert chain.pre_aggregation.byzantine == chain.combiner.byzantine == 2

  def ignored(**flags) -> str:
    config = experiment_config.ExperimentConfig.of(algorithm='fedavg', task='lasso', **flags)
    return settings.ignored_settings(config.aggregation, config.value)

  # f applies with Krum, or with NNM before any robust combiner, not with the median alone.
  assert ignored(aggregator='median', pre_aggregation='nnm', byzantine_clients=2) == ''
  assert ignored(aggregator='krum', byzantine_clients=2) == ''
  assert ignored(aggregator='median', byzantine_clients=2) == (
    '--byzantine_clients applies with --aggregator=bulyan, krum, multi_krum (this run'
    "'s is median) or --pre_aggregation=nnm (this run's is none); it would be ignored."
  )
  assert ignored(aggregator='mean', pre_aggregation='nnm').startswith(
    '--pre_aggregation applies with --aggregator=bulyan, centered_clip,'
  )
