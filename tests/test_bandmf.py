"""BandMF: the strategy (`matrix_factorization`) against closed forms and brute force, its
sensitivity under participation at least b rounds apart, and its noise
(`ops.aggregators.BandedNoise`) against C^{-1} z solved densely in NumPy."""

import math

import numpy as np
import pytest
import tensorflow as tf

from tff_comp import strategy_cache
from tff_comp.ops import matrix_factorization as mf
import tff_comp.ops.aggregators as agg


def _error(c: np.ndarray) -> float:
  """||A C^{-1}||_F^2 in NumPy (dense inverse)."""
  return float(np.sum((mf.prefix_workload(len(c)) @ np.linalg.inv(c)) ** 2))


def test_one_band_is_independent_noise_and_its_error_is_the_workloads():
  """b = 1: C = I (unit columns), error ||A||_F^2 = n (n + 1) / 2: DP-FedAvg's noise."""
  s = mf.optimize(6, 1)
  np.testing.assert_allclose(s.dense(), np.eye(6), atol=1e-12)
  assert s.error() == pytest.approx(21.0)


def test_two_rounds_two_bands_is_the_brute_force_optimum():
  """n = 2, b = 2: C = [[cos a, 0], [sin a, 1]]; the optimizer finds the grid's best."""
  grid = np.linspace(-np.pi / 2 + 1e-3, np.pi / 2 - 1e-3, 200001)
  errors = [_error(np.array([[np.cos(a), 0], [np.sin(a), 1]])) for a in grid[::100]]
  fine = grid[max(0, 100 * int(np.argmin(errors)) - 100) : 100 * int(np.argmin(errors)) + 100]
  best = min(_error(np.array([[np.cos(a), 0], [np.sin(a), 1]])) for a in fine)
  s = mf.optimize(2, 2)
  assert s.error() == pytest.approx(best, rel=1e-6)
  assert _error(s.dense()) == pytest.approx(s.error(), rel=1e-9)  # the loss is the error
  assert s.error() < _error(np.eye(2))  # correlated noise beats independent noise


def test_the_optimized_strategy_improves_on_its_start_and_on_fewer_bands():
  n = 24
  errors = {b: mf.optimize(n, b).error() for b in (1, 2, 4, 8)}
  start = mf.banded_sqrt(n, 8)
  assert errors[8] < start.error() < errors[1]
  assert errors[1] > errors[2] > errors[4] > errors[8]
  s = mf.optimize(n, 4)
  c = s.dense()
  assert np.allclose(np.linalg.norm(c, axis=0), 1.0)  # unit columns
  assert np.all(np.triu(c, 1) == 0) and np.all(np.tril(c, -4) == 0)  # 4 bands


def test_the_optimized_strategy_beats_the_banded_square_root_closed_form():
  """Kalinin and Lampert (2024)'s banded square root, written here from the paper: C the
  b-banded lower Toeplitz truncation of A^(1/2), whose coefficients are binom(2k, k) /
  4^k, its columns normalized as BandMF's are (participations b apart then have
  sensitivity sqrt(k)). Its error ||A C^-1||_F^2 bounds the optimized strategy's from
  above: n = 100, b = 32 gives 577.3, against 5,050 (= ||A||_F^2) for independent noise."""
  n, b = 100, 32
  coefficients = [math.comb(2 * k, k) / 4**k for k in range(b)]
  c = sum(np.diag(np.full(n - k, coefficients[k]), -k) for k in range(b))
  closed_form = _error(c / np.linalg.norm(c, axis=0))
  assert closed_form == pytest.approx(577.25, abs=0.01)
  assert _error(np.eye(n)) == pytest.approx(5050.0)
  optimized = mf.optimize(n, b)
  assert optimized.error() < closed_form - 10  # 554.8
  assert optimized.error() == pytest.approx(_error(optimized.dense()), rel=1e-9)


def _convex_optimum(n: int, b: int) -> tuple[float, np.ndarray]:
  """The papers' program in X = C^T C (Choquette-Choo et al. 2023): min tr(A^T A X^-1)
  over symmetric X > 0 with unit diagonal (unit columns of C) and X_ij = 0 for |i - j|
  >= b (b bands), convex with one optimum; solved here by Newton's method on X's free
  entries, a solver and parametrization of its own (the strategy's is L-BFGS on C's
  bands). Returns (the optimal error, X)."""
  a = mf.prefix_workload(n)
  m = a.T @ a
  pairs = [(i, j) for i in range(n) for j in range(i) if i - j < b]
  basis = np.zeros((n * n, len(pairs)))  # column k: the symmetric pair (i, j) of X
  for k, (i, j) in enumerate(pairs):
    basis[i * n + j, k] = basis[j * n + i, k] = 1.0

  def error(x):
    if np.any(np.linalg.eigvalsh(x) <= 0):
      return np.inf
    return float(np.trace(m @ np.linalg.inv(x)))

  x = np.eye(n)
  for _ in range(50):
    y = np.linalg.inv(x)
    p = y @ m @ y  # the gradient in X is -P; the Hessian [E, F] = tr(Y F P E) + tr(P F Y E)
    gradient = -basis.T @ p.ravel()
    if np.abs(gradient).max() < 1e-11:
      break
    hessian = np.einsum('ab,cd->dabc', y, p) + np.einsum('ab,cd->dabc', p, y)
    hessian = basis.T @ hessian.reshape(n * n, n * n) @ basis
    step = (basis @ np.linalg.solve(hessian, -gradient)).reshape(n, n)
    t, now = 1.0, error(x)
    while error(x + t * step) > now + 1e-4 * t * np.sum(-p * step):
      t /= 2
    x = x + t * step
  return error(x), x


@pytest.mark.parametrize('n,b', [(8, 3), (12, 4), (16, 16), (24, 8)])
def test_the_strategy_is_the_optimum_of_the_papers_convex_program(n, b):
  """The optimizer's C is the optimum of the multi-epoch paper's convex program in X =
  C^T C (b = n: the dense single-participation factorization): its error to 1e-7, C^T C
  to 1e-3 (the optimum is flat). The papers' tables are not at hand to compare with."""
  optimum, x = _convex_optimum(n, b)
  s = mf.optimize(n, b)
  assert s.error() == pytest.approx(optimum, rel=1e-7)
  np.testing.assert_allclose(s.dense().T @ s.dense(), x, atol=1e-3)
  assert optimum < mf.banded_sqrt(n, b).error()  # the start is not already the optimum


def test_the_sensitivity_is_sqrt_k_when_rounds_are_b_apart_and_more_when_closer():
  """Brute force over every participation pattern of an optimized C (n = 9, b = 3): k
  rounds at least b apart change C x by sqrt(k) at most; rounds closer change it more,
  which is why the sampler must keep them apart."""
  s = mf.optimize(9, 3)
  c = s.dense()
  k = 3
  assert mf.sensitivity(c, k, separation=3) == pytest.approx(math.sqrt(k), rel=1e-9)
  assert mf.banded_sensitivity(s, k, separation=3) == math.sqrt(k)
  assert mf.sensitivity(c, k, separation=1) > math.sqrt(k) + 0.1
  with pytest.raises(ValueError, match='needs rounds at least 3 apart'):
    mf.banded_sensitivity(s, k, separation=2)


def test_strategies_are_cached_on_disk_by_rounds_and_bands(tmp_path, monkeypatch, capsys):
  """Optimized once, saying so, then read in silence; a damaged file is optimized again
  and replaced."""
  monkeypatch.setenv('TFF_COMP_DATA_DIR', str(tmp_path))
  strategy_cache.strategy.cache_clear()
  first = strategy_cache.strategy(10, 3)
  said = capsys.readouterr().out.splitlines()
  assert said[0].startswith('BandMF: optimizing the noise strategy for 10 rounds and 3 bands')
  assert said[1].startswith('BandMF: strategy optimized in ') and len(said) == 2
  (cached,) = (tmp_path / 'bandmf').glob('*n10-b3.npz')
  strategy_cache.strategy.cache_clear()
  optimize = mf.optimize
  monkeypatch.setattr(mf, 'optimize', lambda *_: pytest.fail('optimized again'))
  assert strategy_cache.strategy(10, 3) == first
  assert capsys.readouterr().out == ''
  strategy_cache.strategy.cache_clear()
  cached.write_bytes(cached.read_bytes()[:50])
  monkeypatch.setattr(mf, 'optimize', optimize)
  assert strategy_cache.strategy(10, 3) == first
  assert 'is not used (unreadable)' in capsys.readouterr().out
  assert np.load(cached)['band'].shape == (10, 3)
  strategy_cache.strategy.cache_clear()


@pytest.mark.parametrize(
  'checksum, says',
  [('kept', 'its checksum differs'), ('recomputed', 'a column of norm 1 +')],
)
def test_a_tampered_cached_strategy_is_not_used(tmp_path, monkeypatch, capsys, checksum, says):
  """One entry times 1.01 (the column's norm then 1.002, so the stated epsilon would be
  wrong): refused by its checksum, or, checksum rewritten to match, by its column norms;
  optimized again, and the run gets the true strategy."""
  monkeypatch.setenv('TFF_COMP_DATA_DIR', str(tmp_path))
  strategy_cache.strategy.cache_clear()
  first = strategy_cache.strategy(10, 3)
  (cached,) = (tmp_path / 'bandmf').glob('*n10-b3.npz')
  with np.load(cached) as saved:
    band, digest = saved['band'].copy(), str(saved['sha256'])
  band[4, 1] *= 1.01
  if checksum == 'recomputed':
    digest = strategy_cache._digest(band)
  np.savez(cached, band=band, sha256=digest)
  capsys.readouterr()
  strategy_cache.strategy.cache_clear()
  assert strategy_cache.strategy(10, 3) == first
  said = capsys.readouterr().out.splitlines()
  assert 'is not used' in said[0] and says in said[0], said
  assert said[1].startswith('BandMF: optimizing the noise strategy')
  strategy_cache.strategy.cache_clear()


@pytest.mark.parametrize('bands', [1, 3])
def test_the_rounds_noise_is_c_inverse_z(bands):
  """Over n rounds the stage adds (C^{-1} z)_t, z the stream it draws: solved densely."""
  n, d, stddev = 7, 5, 0.7
  s = mf.optimize(n, bands)
  stage = agg.BandedNoise(stddev, s).bind(d)
  state = stage.initial_state()
  seed = tf.constant([11, 0], tf.int64)
  context = agg.base.Context(tf.constant(3.0), tf.constant(3.0), tf.constant(1.0))
  added, z = [], []
  for t in range(n):
    y, state, _ = stage.decode(state, tf.zeros([d]), {}, context, seed + [0, t])
    added.append(y.numpy())
    key = tf.constant([11, 0xBA4D], tf.int64)
    z.append(
      stddev
      * tf.random.stateless_normal(
        [d], tf.random.experimental.stateless_fold_in(key, tf.constant(t, tf.int64))
      ).numpy()
    )
  np.testing.assert_allclose(
    np.array(added), np.linalg.solve(s.dense(), np.array(z)), rtol=1e-4, atol=1e-5
  )
  assert int(state[0]) == n


def test_the_noise_of_the_prefix_sums_is_b_z():
  """The released prefix sums carry B z = A C^{-1} z: their covariance over many seeds
  is sigma^2 B B^T, below independent noise's sigma^2 A A^T in total."""
  n, d = 6, 20000
  s = mf.optimize(n, 3)
  stage = agg.BandedNoise(1.0, s).bind(d)
  state = stage.initial_state()
  context = agg.base.Context(tf.constant(1.0), tf.constant(1.0), tf.constant(1.0))
  rounds = []
  for t in range(n):
    y, state, _ = stage.decode(state, tf.zeros([d]), {}, context, tf.constant([5, t], tf.int64))
    rounds.append(y.numpy())
  prefix = np.cumsum(np.array(rounds), axis=0)  # [n, d]: d independent draws of B z
  b = mf.prefix_workload(n) @ np.linalg.inv(s.dense())
  np.testing.assert_allclose(np.cov(prefix), b @ b.T, atol=0.2)
  assert np.trace(b @ b.T) < np.trace(mf.prefix_workload(n) @ mf.prefix_workload(n).T)


def test_bad_strategies_are_refused():
  with pytest.raises(ValueError, match='bands must be in'):
    mf.optimize(3, 4)
  with pytest.raises(ValueError, match=r'C\[t, t\] must be > 0'):
    agg.BandedNoise(1.0, mf.Strategy(np.zeros((3, 2))))
  with pytest.raises(ValueError, match='bind'):
    agg.BandedNoise(1.0, mf.banded_sqrt(3, 2)).initial_state()


def test_a_chain_with_banded_noise_needs_a_sum():
  strategy = mf.banded_sqrt(4, 2)
  agg.Chain((agg.Clip(1.0, private=True), agg.BandedNoise(1.0, strategy)), agg.Mean(denominator=3))
  with pytest.raises(ValueError, match='noises a sum'):
    agg.Chain((agg.BandedNoise(1.0, strategy),), agg.Median())
