"""Robust combiners against the one row an attacker can always send (NaN, inf, 1e20) and
far from the origin, checked against NumPy written from the papers on the honest rows:
one such row must not carry the result anywhere (#75)."""

import numpy as np
import pytest
import tensorflow as tf

from tests import numpy_reference
import tff_comp.ops.aggregators as agg

RNG_SEED = 3
RNG = np.random.default_rng(RNG_SEED)
M, D = 10, 64


def _combine(combiner, x, measured=False):
  """The combined vector of rows `x` (and the measurements, if `measured`)."""
  chain = agg.Chain((), combiner).bind(x.shape[1])
  update, _, _, measurements = chain.aggregate(
    chain.initial_state(),
    tf.constant(x, tf.float32),
    tf.ones([len(x)], tf.float32),
    tf.zeros([len(x), chain.row_size], tf.float32),
    tf.constant(np.stack([np.full(len(x), 1), np.arange(len(x))], 1), tf.int64),
    tf.constant([1, 2], tf.int64),
  )
  return (np.asarray(update), measurements) if measured else np.asarray(update)


ATTACKS = {
  'nan': np.nan,
  'inf': np.inf,
  '-inf': -np.inf,
  'huge': 1e20,
  'max': np.finfo(np.float32).max,
}
COMBINERS = {
  'median': agg.Median(),
  'trimmed_mean': agg.TrimmedMean(0.1),
  'krum': agg.Krum(1),
  'multi_krum': agg.Krum(1, M - 1),
  'geometric_median': agg.GeometricMedian(),
  'centered_clip': agg.CenteredClip(tau=1.0, iters=3),
  'bulyan': agg.Bulyan(1),
}


@pytest.mark.parametrize('attack', list(ATTACKS))
@pytest.mark.parametrize('name', list(COMBINERS))
def test_one_extreme_row_moves_a_robust_combiner_no_further_than_an_honest_row(name, attack):
  """With the attacker at any row, the result is finite and within the honest rows' box
  (coordinate-wise, the range of the honest values): a result outside it was pulled by
  the attacker, as every combiner here takes values from, or convex combinations of,
  honest rows when one row of ten is bad."""
  honest = RNG.normal(size=(M - 1, D)).astype(np.float32)
  for position in (0, 4, M - 1):
    x = np.insert(honest, position, ATTACKS[attack], axis=0)
    got = _combine(COMBINERS[name], x)
    assert np.all(np.isfinite(got)), (name, attack, position)
    low, high = honest.min(0), honest.max(0)
    assert np.all((got >= low - 1e-5) & (got <= high + 1e-5)), (name, attack, position)


@pytest.mark.parametrize('attack', ['nan', 'inf', 'huge'])
def test_krum_and_multi_krum_never_choose_the_extreme_row(attack):
  """Krum equals its brute-force choice among the honest rows (the attacker's score is
  the largest); Multi-Krum's m - f rows are exactly the honest ones."""
  for trial in range(10):
    honest = RNG.normal(size=(M - 1, D)).astype(np.float32)
    x = np.insert(honest, trial % M, ATTACKS[attack], axis=0)
    expected = honest[np.argmin(numpy_reference.krum_scores(honest.astype(np.float64), 0))]
    np.testing.assert_allclose(_combine(agg.Krum(1), x), expected, rtol=1e-6)
    np.testing.assert_allclose(
      _combine(agg.Krum(1, M - 1), x), honest.astype(np.float64).mean(0), rtol=1e-5, atol=1e-6
    )


def test_krum_far_from_the_origin_chooses_the_exact_minimum():
  """Rows at offset 1e4 and spread 1 (offset/spread 1e4): the float32 Gram-matrix
  distances chose a row of non-minimal exact score in 18 of 20 trials."""
  wrong = 0
  for _ in range(20):
    x = (1e4 + RNG.normal(size=(M, D))).astype(np.float32)
    expected = np.argmin(numpy_reference.krum_scores(x.astype(np.float64), 2))
    got = _combine(agg.Krum(2), x)
    wrong += not np.array_equal(got, x[expected])
  assert wrong == 0


def test_krum_at_float32s_farthest_offset_chooses_the_exact_minimum():
  """Integer rows at offset 2^23 (float32 still holds every integer there) and spread 1:
  the exact integer scores against Krum's; the float64 Gram-matrix distances taken from
  the origin (||a||^2 = 7e16, past float64's integers) chose a row of non-minimal score."""
  for _ in range(10):
    z = RNG.integers(-1, 2, size=(M, 1024))
    expected = numpy_reference.krum_chosen(z, 2, 1)[0]  # int64: exact, ties by position
    got = _combine(agg.Krum(2), (2**23 + z).astype(np.float32))
    np.testing.assert_array_equal(got, 2**23 + z[expected])


@pytest.mark.parametrize('name', ['median', 'trimmed_mean'])
def test_a_nan_value_counts_as_the_largest_for_coordinate_wise_combiners(name):
  honest = RNG.normal(size=(M - 1, D)).astype(np.float32)
  with_nan = np.insert(honest, 2, np.nan, axis=0)
  with_inf = np.insert(honest, 2, np.inf, axis=0)
  np.testing.assert_array_equal(
    _combine(COMBINERS[name], with_nan), _combine(COMBINERS[name], with_inf)
  )


@pytest.mark.parametrize(
  'combiner, m, clamped',
  [
    (agg.Krum(2), 6, 1.0),  # 2f + 3 = 7
    (agg.Krum(2), 7, 0.0),
    (agg.Krum(1, 6), 5, 1.0),  # Multi-Krum's 6 rows from 5
    (agg.Krum(1, 5), 5, 0.0),
    (agg.Bulyan(1), 6, 1.0),  # 4f + 3 = 7
    (agg.Bulyan(1), 7, 0.0),
  ],
)
def test_a_round_below_the_rules_cohort_says_it_clamped(combiner, m, clamped):
  """The settings refuse such a cohort; a round made smaller (dropouts, Poisson
  sampling) says so in its record (#75)."""
  _, measured = _combine(combiner, RNG.normal(size=(m, 8)).astype(np.float32), measured=True)
  assert float(measured[f'{combiner.name.replace("multi_", "")}_clamped']) == clamped
