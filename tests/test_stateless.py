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


def _mix32(x: np.ndarray) -> np.ndarray:
  """The murmur-style finalizer in NumPy's uint32, written from its definition."""
  x = x.astype(np.uint32)
  for _ in range(2):
    x = (x ^ (x >> np.uint32(16))) * np.uint32(0x45D9F3B)
  return x ^ (x >> np.uint32(16))


def test_the_bits_are_the_hash_written_in_numpy():
  """Every run's shuffles and draws come from these bits: a change to them is a change
  to every recorded run, so they are pinned to an independent NumPy reference."""
  rng = np.random.default_rng(0)
  x = np.concatenate([rng.integers(-(2**62), 2**62, 10_000), [0, -1, 2**63 - 1, -(2**63)]])
  np.testing.assert_array_equal(
    stateless.mix32(tf.constant(x, tf.int64)).numpy(), _mix32(x.astype(np.uint64))
  )
  seeds = rng.integers(-(2**62), 2**62, (5, 2))
  key = np.zeros((5, 1), np.uint32)
  for column in range(2):
    for half in (seeds[:, column : column + 1], seeds[:, column : column + 1] >> 32):
      key = _mix32(key * np.uint32(31) ^ half.astype(np.uint64).astype(np.uint32))
  second = _mix32(key + np.uint32(0x2545F491))
  bits = _mix32(_mix32(key + np.arange(300, dtype=np.uint32)[None, :]) + second)
  want = (bits >> np.uint32(8)).astype(np.float32) * np.float32(2.0**-24)
  got = stateless.row_uniform(tf.constant(seeds, tf.int64), 300).numpy()
  np.testing.assert_array_equal(got, want)
