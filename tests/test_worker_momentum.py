"""Worker momentum (Karimireddy, He and Jaggi 2021) against NumPy over rounds: each
client sends m_i <- beta m_i + (1 - beta) x_i, kept across rounds, untouched while it
sits out; its place in the chain (before the attackers) and its refusals."""

import numpy as np
import pytest
import tensorflow as tf

from tff_comp import experiment
from tff_comp.config import aggregation_settings
from tff_comp.ops import aggregators as agg

D, BETA = 4, 0.8


def test_each_client_sends_its_momentum_kept_across_rounds():
  rng = np.random.default_rng(0)
  chain = agg.Chain((agg.WorkerMomentum(BETA),), agg.Median()).bind(D)
  population = np.zeros((6, D), np.float32)  # the runtime's rows, by client
  kept = np.zeros((6, D))  # NumPy's momenta
  for round_num, cohort in enumerate(([0, 1, 2, 3], [2, 3, 4, 5], [0, 2, 4, 5]), 1):
    x = rng.normal(size=(4, D)).astype(np.float32)
    update, rows, *_ = chain.aggregate(
      chain.initial_state(),
      tf.constant(x),
      tf.ones(4),
      tf.constant(population[cohort]),
      agg.base.client_seeds(0, round_num, tf.constant(cohort)),
      agg.base.round_seed(0, round_num),
    )
    population[cohort] = rows.numpy()
    kept[cohort] = BETA * kept[cohort] + (1 - BETA) * x
    np.testing.assert_allclose(population, kept, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(update.numpy(), np.median(kept[cohort], 0), rtol=1e-5, atol=1e-6)


def test_it_comes_before_the_attackers_and_is_refused_where_rows_cannot_live(tmp_path):
  options = aggregation_settings.AggregationOptions(
    aggregator='krum', worker_momentum=0.9, attack='alie'
  )
  assert options.chain(None, 10).name == 'momentum+attack+krum'
  with pytest.raises(ValueError, match=r'beta in \[0, 1\)'):
    agg.WorkerMomentum(1.0)

  def prepared(**settings):
    return experiment.prepare(
      experiment.ExperimentConfig.of(
        algorithm='fedavg',
        task='lasso',
        rounds=1,
        aggregator='median',
        worker_momentum=0.9,
        output_dir=str(tmp_path),
        **settings,
      )
    )

  with pytest.raises(experiment.ConfigError, match='--worker_momentum keeps a row per client'):
    prepared(sampling='with_replacement')
  with pytest.raises(experiment.ConfigError, match="TFF's stateless clients cannot hold"):
    experiment.build_runner(prepared(runtime='tff'))
