"""`ops.stateless.row_uniform`: uniform, a row a function of its seed alone, unrelated
rows for nearby seeds, the same bits compiled and eager."""

import numpy as np
import scipy.stats
import tensorflow as tf

from tff_comp.ops import stateless


def _seeds(rows: int, offset: int = 0) -> tf.Tensor:
  """Seeds as the engines make them: nearby integers (run, round, client)."""
  return tf.constant([[7, offset + i] for i in range(rows)], tf.int64)


def test_draws_are_uniform():
  draws = stateless.row_uniform(_seeds(50), 2000).numpy().ravel()
  assert draws.min() >= 0 and draws.max() < 1
  assert scipy.stats.kstest(draws, 'uniform').pvalue > 1e-3
  counts = np.bincount((draws * 16).astype(int), minlength=16)  # the 16 buckets alike
  assert scipy.stats.chisquare(counts).pvalue > 1e-3


def test_a_row_depends_on_its_seed_alone():
  cohort = stateless.row_uniform(_seeds(6), 64).numpy()
  alone = stateless.row_uniform(_seeds(1, offset=4), 64).numpy()
  np.testing.assert_array_equal(cohort[4], alone[0])
  reversed_ = stateless.row_uniform(tf.reverse(_seeds(6), [0]), 64).numpy()
  np.testing.assert_array_equal(reversed_[::-1], cohort)


def test_rows_of_nearby_seeds_are_unrelated():
  """Seeds one apart (in either word), and shifted copies of a row: no correlation
  beyond sampling noise."""
  d = 4096
  rows = stateless.row_uniform(
    tf.constant([[7, 0], [7, 1], [8, 0], [7, 2**32], [-7, 0]], tf.int64), d
  ).numpy()
  correlations = np.corrcoef(rows)[np.triu_indices(len(rows), 1)]
  assert np.abs(correlations).max() < 5 / np.sqrt(d), correlations
  for shift in (1, 2, 31):  # no row is another's stream shifted
    lagged = [np.corrcoef(a[shift:], b[:-shift])[0, 1] for a in rows for b in rows]
    assert np.abs(lagged).max() < 5 / np.sqrt(d), (shift, lagged)


def test_compiled_draws_equal_eager_ones():
  seeds = _seeds(10, offset=123)
  compiled = tf.function(lambda s: stateless.row_uniform(s, 1024), jit_compile=True)
  np.testing.assert_array_equal(compiled(seeds).numpy(), stateless.row_uniform(seeds, 1024).numpy())
