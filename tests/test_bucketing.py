"""Bucketing (Karimireddy, He and Jaggi 2022) against NumPy written from the paper's
Algorithm 1, its qualitative result (Krum under heterogeneity regains the honest mean),
and reaching run.py's flags from its module alone."""

import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from tff_comp import settings
from tff_comp.config import aggregation_settings, experiment_config
from tff_comp.ops import aggregators as agg


def _buckets_numpy(x: np.ndarray, order: np.ndarray, s: int) -> np.ndarray:
  """Algorithm 1: rows taken in the permuted order, s at a time, each group averaged."""
  shuffled = x[order]
  return np.stack([shuffled[i : i + s].mean(0) for i in range(0, len(x), s)])


def _seed(k: int) -> tf.Tensor:
  return agg.base.round_seed(k, 3)


@pytest.mark.parametrize('m, s', [(10, 2), (10, 3), (7, 7), (5, 1), (3, 5)])
def test_bucket_means_of_the_rounds_permutation(m, s):
  x = np.random.default_rng(m * 10 + s).normal(size=(m, 4)).astype(np.float32)
  bucketing = agg.Bucketing(s)
  order = bucketing.permutation(m, _seed(1)).numpy()
  assert sorted(order) == list(range(m))
  mixed, weights = bucketing.mix(tf.constant(x), tf.ones(m), _seed(1))
  np.testing.assert_allclose(mixed.numpy(), _buckets_numpy(x, order, s), rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(weights.numpy(), np.ones(-(-m // s)))


def test_the_permutation_is_drawn_anew_each_round_and_uniform():
  bucketing = agg.Bucketing(2)
  firsts = np.array(
    [bucketing.permutation(5, agg.base.round_seed(7, r)).numpy()[0] for r in range(2000)]
  )
  counts = np.bincount(firsts, minlength=5)
  assert counts.min() > 320 and counts.max() < 480, counts  # 400 each; 5 sigma is 90
  assert len({tuple(bucketing.permutation(8, _seed(k)).numpy()) for k in range(20)}) == 20


def test_a_bucket_holding_a_non_finite_row_is_non_finite_and_the_others_exact():
  x = np.random.default_rng(0).normal(size=(6, 3)).astype(np.float32)
  x[4] = np.nan
  bucketing = agg.Bucketing(2)
  order = bucketing.permutation(6, _seed(2)).numpy()
  mixed = bucketing.mix(tf.constant(x), tf.ones(6), _seed(2))[0].numpy()
  expected = _buckets_numpy(x, order, 2)
  np.testing.assert_array_equal(np.isnan(mixed), np.isnan(expected))
  finite = ~np.isnan(expected)
  np.testing.assert_allclose(mixed[finite], expected[finite], rtol=1e-6)


def test_bucketing_brings_krum_back_to_the_honest_mean_under_heterogeneity():
  """The paper's point (its Figure 1 and Table 2): with two clusters of honest clients
  (label-skewed data), Krum picks one cluster's row, an error of the clusters' spread;
  bucket means of pairs drawn across clusters sit near the mean, and Krum picks them."""
  rng = np.random.default_rng(3)
  errors = {1: [], 2: []}
  for round_num in range(40):
    x = np.concatenate([1.0 + 0.1 * rng.normal(size=(5, 8)), -1.0 + 0.1 * rng.normal(size=(5, 8))])
    x = x.astype(np.float32)
    for s in errors:
      chain = agg.Chain((), agg.Krum(1), agg.Bucketing(s))
      update, *_ = chain.aggregate(
        chain.initial_state(),
        tf.constant(x),
        tf.ones(10),
        tf.zeros([10, 0]),
        agg.base.client_seeds(0, round_num, tf.range(10)),
        agg.base.round_seed(0, round_num),
      )
      errors[s].append(np.linalg.norm(update.numpy() - x.mean(0)))
  # s = 1 only permutes the rows: Krum still picks one cluster's (an error near 2.8).
  assert np.mean(errors[1]) > 2.5
  assert np.mean(errors[2]) < 0.6 * np.mean(errors[1]), (np.mean(errors[2]), np.mean(errors[1]))


def test_the_flags_build_it_and_refuse_its_size_without_it():
  options = aggregation_settings.AggregationOptions(
    aggregator='median', pre_aggregation='bucketing', bucket_size=3
  )
  chain = options.chain(None, 10)
  assert chain.name == 'bucketing+median' and chain.pre_aggregation.bucket_size == 3
  config = experiment_config.ExperimentConfig.of(
    algorithm='fedavg', task='lasso', aggregator='median', bucket_size=3
  )
  assert settings.ignored_settings(config.aggregation, config.value) == (
    "--bucket_size applies with --pre_aggregation=bucketing (this run's is none); it would"
    ' be ignored.'
  )


def test_run_py_runs_krum_after_bucketing(repo_root, tmp_path):
  done = subprocess.run(
    [
      sys.executable,
      str(repo_root / 'binaries' / 'run.py'),
      '--algo=fedavg',
      '--task=lasso',
      '--rounds=2',
      '--aggregator=krum',
      '--pre_aggregation=bucketing',
      '--bucket_size=2',
      f'--output_dir={tmp_path / "run"}',
    ],
    capture_output=True,
    text=True,
    timeout=300,
    stdin=subprocess.DEVNULL,
    env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3'),
  )
  assert done.returncode == 0, done.stderr[-2000:]
  assert 'aggregator bucketing+krum' in done.stdout
