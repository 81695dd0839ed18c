"""The inner-product manipulation attack (Xie, Koyejo and Gupta 2020) against NumPy
written from the paper, its closed form under the mean, and its flags."""

import numpy as np
import tensorflow as tf

from tff_comp import settings
from tff_comp.config import aggregation_settings, experiment_config
from tff_comp.ops import aggregators as agg

M, D = 12, 5


def _round(attack: agg.Attack, x: np.ndarray, combiner: agg.Combiner):
  """(the rows sent, who attacked, the chain's result) of one round."""
  chain = agg.Chain((attack,), combiner).bind(D)
  seeds = agg.base.client_seeds(4, 2, tf.range(M))
  sent = chain.encode(chain.initial_state(), tf.constant(x), tf.ones(M), tf.zeros([M, 0]), seeds)
  result, *_ = chain.aggregate(
    chain.initial_state(),
    tf.constant(x),
    tf.ones(M),
    tf.zeros([M, 0]),
    seeds,
    agg.base.round_seed(4, 2),
  )
  return sent.values.numpy(), sent.counts['0/attackers'].numpy() > 0, result.numpy()


def test_each_attacker_sends_minus_epsilon_times_the_honest_mean():
  x = np.random.default_rng(0).normal(1.0, 0.5, size=(M, D)).astype(np.float32)
  sent, bad, _ = _round(agg.InnerProductManipulation(0.4, 0.1), x, agg.Median())
  assert 0 < bad.sum() < M
  np.testing.assert_array_equal(sent[~bad], x[~bad])
  np.testing.assert_allclose(sent[bad], np.tile(-0.1 * x[~bad].mean(0), (bad.sum(), 1)), rtol=1e-6)


def test_under_the_mean_the_inner_product_turns_negative_past_m_minus_q_over_q():
  """The mean is mu (m - q - q epsilon) / m: its inner product with the honest mean mu
  is negative exactly when epsilon > (m - q) / q (the paper's section 3)."""
  x = np.random.default_rng(1).normal(1.0, 0.5, size=(M, D)).astype(np.float32)
  for epsilon in (0.1, 1.0, 5.0):
    _, bad, mean = _round(agg.InnerProductManipulation(0.4, epsilon), x, agg.Mean())
    q, mu = bad.sum(), x[~bad].mean(0)
    np.testing.assert_allclose(mean, mu * (M - q - q * epsilon) / M, rtol=1e-5, atol=1e-6)
    assert (mean @ mu < 0) == (epsilon > (M - q) / q), (epsilon, q)


def test_the_flags_build_it_and_refuse_its_epsilon_elsewhere():
  options = aggregation_settings.AggregationOptions(
    aggregator='median', attack='ipm', ipm_epsilon=2.0
  )
  attack = options.chain(None, 10).stages[0]
  assert isinstance(attack, agg.InnerProductManipulation) and attack.scale == 2.0
  config = experiment_config.ExperimentConfig.of(
    algorithm='fedavg', task='lasso', attack='sign_flip', ipm_epsilon=2.0
  )
  assert settings.ignored_settings(config.aggregation, config.value) == (
    "--ipm_epsilon applies with --attack=ipm (this run's is sign_flip); it would be ignored."
  )
