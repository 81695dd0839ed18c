"""BandMF's noise: Gaussian noise correlated across rounds by a banded matrix
factorization A = B C of the prefix sums (`ops.matrix_factorization` gives C and
the math; Choquette-Choo et al. 2023, "(Amplified) Banded Matrix Factorization").

Round t (from 0) adds to the combined sum, before the combiner's scaling,

    w_t = (z_t - sum_{j=1}^{b-1} C[t, t-j] w_{t-j}) / C[t, t],    z_t ~ N(0, stddev^2 I),

the t-th row of C^{-1} z: the sums' prefixes (what an SGD server step accumulates) then
carry B z, the factorization's noise. z_t is drawn from (the run's seed, t) alone; the
stage's state is t, the last b - 1 noise vectors (newest first) and C's bands, so a
resumed run adds the noise it would have added.
"""

import numpy as np
import tensorflow as tf

from tff_comp.ops import matrix_factorization
from tff_comp.ops.aggregators import base


class BandedNoise(base.Stage):
  """w_t (module docstring) of std `stddev` a z (the noise multiplier times the clip
  norm), for `strategy`'s C (`matrix_factorization.Strategy`)."""

  name = 'banded_noise'
  randomized = True
  in_state = ('strategy',)  # read from the state: one program runs strategies of one shape

  def __init__(self, stddev: float, strategy: matrix_factorization.Strategy, d: int | None = None):
    if not stddev >= 0:
      raise ValueError(f'the noise std must be >= 0, got {stddev}.')
    if not np.all(strategy.band[:, 0] > 0):
      raise ValueError("a strategy's C[t, t] must be > 0.")
    self.stddev, self.strategy, self.d = stddev, strategy, d
    self.shape = strategy.band.shape

  def bind(self, d: int) -> 'BandedNoise':
    return BandedNoise(self.stddev, self.strategy, d)

  def initial_state(self):
    """(t int64, the last b - 1 noise vectors [b - 1, d], C's bands [n, b])."""
    if self.d is None:
      raise ValueError("BandedNoise needs the rows' size: bind(d) first.")
    return (
      tf.zeros([], tf.int64),
      tf.zeros([self.strategy.bands - 1, self.d]),
      tf.constant(self.strategy.band, tf.float32),
    )

  def decode(self, state, y, counts, context, seed):
    t, previous, band = state
    # The run's key, as TreeNoise's: the round's seed word depends on more than t.
    key = tf.stack([seed[0], tf.constant(0xBA4D, tf.int64)])
    z = tf.random.stateless_normal(tf.shape(y), tf.random.experimental.stateless_fold_in(key, t))
    row = tf.gather(band, t)  # C[t, t], C[t, t-1], ..., C[t, t-b+1] (0 before round 0)
    w = (z - tf.linalg.matvec(previous, row[1:], transpose_a=True)) / row[0]
    y = y + self.stddev * w * context.scale
    previous = tf.concat([w[None], previous], 0)[: self.strategy.bands - 1]
    return y, (t + 1, previous, band), base.Measurements()

  def why_not(self, chain) -> str:
    return base.noises_a_sum(chain, 'banded matrix factorization')
