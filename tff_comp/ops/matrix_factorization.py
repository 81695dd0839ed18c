"""Banded matrix factorization strategies for DP-FTRL (BandMF: Choquette-Choo, Ganesh,
McKenna, McMahan, Rush, Thakurta and Xu 2023, "(Amplified) Banded Matrix Factorization:
A unified approach to private training", NeurIPS; "Multi-Epoch Matrix Factorization
Mechanisms for Private Machine Learning", ICML 2023).

An SGD server step at a constant rate releases, after round t, the prefix sum
(A x)_t = x_1 + ... + x_t of the rounds' clipped sums x: A is the n x n lower-triangular
matrix of ones (the workload). A factorization A = B C releases B (C x + z), z ~ N(0,
sigma^2 I) a round, which is A (x + C^{-1} z): each round's sum gets the noise

    w_t = (C^{-1} z)_t = (z_t - sum_{j=1}^{b-1} C[t, t-j] w_{t-j}) / C[t, t]

for C lower triangular with b bands (C[t, s] = 0 for t - s >= b), so a round keeps the
last b - 1 noise vectors (`ops.aggregators.BandedNoise`).

Privacy: a client whose rounds are at least b apart touches columns of C whose supports
(rows s .. s + b - 1 of column s) do not overlap; with every column of unit norm, its
k rounds change C x by at most sqrt(k) clip norms (`sensitivity`), so the run is one
Gaussian mechanism of noise multiplier sigma / sqrt(k) (`accounting`).

The strategy: of the b-banded C with unit columns, the one of least total squared error
||A C^{-1}||_F^2 (the papers' objective, sensitivity fixed at sqrt(k)), found by L-BFGS
from the banded square root of A (Kalinin and Lampert 2024: A^{1/2} has the entries
binom(2k, k) / 4^k on its k-th subdiagonal); `tff_comp.strategy_cache` keeps them on
disk by (n, b). NumPy, SciPy and TensorFlow (the objective's gradient), no TFF.
"""

import dataclasses
import itertools
import math

import numpy as np
import scipy.optimize
import tensorflow as tf

# Strategies larger than this take minutes to optimize (an n x n solve per step).
MAX_ROUNDS = 2000
_VERSION = 1  # of the objective and the optimizer: a new one caches anew


@dataclasses.dataclass(frozen=True, eq=False)
class Strategy:
  """A b-banded lower-triangular C over n rounds, as its bands: `band[t, j]` is
  C[t, t - j] (0 where t - j < 0); every column has unit norm. Equal when their bands
  are."""

  band: np.ndarray  # [n, b] float64

  def __eq__(self, other) -> bool:
    return isinstance(other, Strategy) and np.array_equal(self.band, other.band)

  def __hash__(self) -> int:
    return hash((self.band.shape, self.band.tobytes()))

  def __repr__(self) -> str:  # no solve: reprs are taken when chains are compared
    return f'Strategy(rounds={self.rounds}, bands={self.bands})'

  @property
  def rounds(self) -> int:
    return self.band.shape[0]

  @property
  def bands(self) -> int:
    return self.band.shape[1]

  def dense(self) -> np.ndarray:
    """C, [n, n]."""
    return _dense_tf(tf.constant(self.band)).numpy()

  def error(self) -> float:
    """||A C^{-1}||_F^2: the total squared error of the prefix sums, per unit noise
    variance, sensitivity excluded."""
    return float(_loss(tf.constant(self.band)).numpy())


def prefix_workload(n: int) -> np.ndarray:
  """A: the n x n lower-triangular matrix of ones."""
  return np.tril(np.ones((n, n)))


def _dense_tf(band: tf.Tensor) -> tf.Tensor:
  """C from its bands (differentiable)."""
  n, b = band.shape
  return tf.add_n([tf.linalg.diag(band[j:, j], k=-j, num_rows=n, num_cols=n) for j in range(b)])


def _normalized(band: tf.Tensor) -> tf.Tensor:
  """The bands with every column of C scaled to unit norm (column s holds band[s + j, j])."""
  n, b = band.shape
  squares = tf.add_n(
    [tf.pad(tf.square(band[j:, j]), [[0, j]]) for j in range(b)]
  )  # column s's squared norm at s
  norms = tf.sqrt(squares)
  return tf.stack(
    [band[:, j] / tf.pad(norms[: n - j], [[j, 0]], constant_values=1.0) for j in range(b)], 1
  )


def _loss(band: tf.Tensor) -> tf.Tensor:
  """||A C^{-1}||_F^2 of the bands' C, columns normalized; A C^{-1} is C^{-1}'s rows
  summed cumulatively (A is never formed)."""
  c = _dense_tf(_normalized(band))
  inverse = tf.linalg.triangular_solve(c, tf.eye(c.shape[0], dtype=c.dtype), lower=True)
  return tf.reduce_sum(tf.square(tf.cumsum(inverse, axis=0)))


def banded_sqrt(n: int, b: int) -> Strategy:
  """The banded square root of A, columns normalized: the optimizer's start, and a
  strategy of its own (Kalinin and Lampert 2024)."""
  r = [math.comb(2 * k, k) / 4**k for k in range(b)]
  band = np.array([[r[j] if t >= j else 0.0 for j in range(b)] for t in range(n)])
  return Strategy(_normalized(tf.constant(band)).numpy())


def optimize(n: int, b: int, *, max_steps: int = 500) -> Strategy:
  """The b-banded C with unit columns of least ||A C^{-1}||_F^2 (L-BFGS from the banded
  square root; module docstring)."""
  if not 1 <= b <= n:
    raise ValueError(f'bands must be in [1, rounds = {n}], got {b}.')
  if n > MAX_ROUNDS:
    raise ValueError(f'a strategy over {n} rounds is too large to optimize (at most {MAX_ROUNDS}).')
  start = banded_sqrt(n, b)
  mask = np.array([[t >= j for j in range(b)] for t in range(n)])

  @tf.function(jit_compile=False, reduce_retracing=True)
  def value_and_grad(band):
    with tf.GradientTape() as tape:
      tape.watch(band)
      loss = _loss(band)
    return loss, tape.gradient(loss, band)

  def fun(flat):
    band = np.zeros((n, b))
    band[mask] = flat
    loss, grad = value_and_grad(tf.constant(band))
    return float(loss), grad.numpy()[mask]

  result = scipy.optimize.minimize(
    fun, start.band[mask], jac=True, method='L-BFGS-B', options=dict(maxiter=max_steps)
  )
  band = np.zeros((n, b))
  band[mask] = result.x
  best = Strategy(_normalized(tf.constant(band)).numpy())
  # L-BFGS never ends above its start; a failed line search could: keep the better.
  return best if best.error() <= start.error() else start


def sensitivity(c: np.ndarray, participations: int, separation: int) -> float:
  """max ||C u|| over the participation patterns u in {0, 1}^n of at most
  `participations` rounds, each two at least `separation` apart (brute force: tests
  and small n; the runs use `banded_sensitivity`)."""
  n = c.shape[0]
  best = 0.0
  for k in range(1, participations + 1):
    for rounds in itertools.combinations(range(n), k):
      if all(b - a >= separation for a, b in zip(rounds, rounds[1:])):
        best = max(best, float(np.linalg.norm(c[:, list(rounds)].sum(axis=1))))
  return best


def banded_sensitivity(s: Strategy, participations: int, separation: int) -> float:
  """sqrt(k) for a b-banded C of unit columns when a client's rounds are at least b
  apart (their columns' supports are disjoint: module docstring)."""
  if separation < s.bands:
    raise ValueError(
      f'a {s.bands}-banded strategy needs rounds at least {s.bands} apart, got {separation}.'
    )
  return math.sqrt(participations)
