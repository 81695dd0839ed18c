"""Norm-bounding stages: clipping (with an optional Gaussian mechanism) and zeroing.

    Clip      x_i <- x_i min(1, C / ||x_i||_2)                  (TFF's clipping_factory)
              with noise_multiplier z > 0, the Gaussian mechanism: the combined sum gets
              N(0, (z C)^2 I) before the combiner's scaling (TFF's DP factories)
    Zeroing   x_i <- 0 where ||x_i||_p > Z or x_i is not finite; its weight is kept
              (TFF's zeroing_factory, L-infinity by default; non-finite rows are zeroed
              here, where TFF's comparison with NaN keeps them)

C and Z are fixed, or follow a quantile of the clients' norms (`Quantile`, the geometric
method of Andrew, Thakkar et al. 2021 as TFF's `PrivateQuantileEstimationProcess`): an
estimate E, the bound in force r E + i, and after each round

    b = clamp((sum_i [||x_i|| <= E] - m/2 + N(0, s^2)) / n + 1/2, 0, 1)
    E <- E exp(-lr (b - q))

with n the clients (or a DP run's expected clients), s the count's noise (DP), r and i a
multiplier and an increment (TFF's adaptive zeroing: 2 C + 1).
"""

import dataclasses
import math

import tensorflow as tf

from tff_comp.ops.aggregators import base


@dataclasses.dataclass(frozen=True)
class Quantile:
  """A norm bound adapted to the `target` quantile of the clients' norms (module
  docstring): `learning_rate`, `count_stddev` s, `denominator` n (None: the round's
  clients), `multiplier` r and `increment` i of the reported bound."""

  target: float = 0.5
  learning_rate: float = 0.2
  count_stddev: float = 0.0
  denominator: float | None = None
  multiplier: float = 1.0
  increment: float = 0.0

  def __post_init__(self):
    if not 0 <= self.target <= 1:
      raise ValueError(f'a quantile target must be in [0, 1], got {self.target}.')
    if not self.learning_rate >= 0 or not self.count_stddev >= 0:
      raise ValueError("a quantile's learning rate and count noise must be >= 0.")

  def report(self, estimate: tf.Tensor) -> tf.Tensor:
    return self.multiplier * estimate + self.increment

  def next(
    self, estimate: tf.Tensor, below: tf.Tensor, clients: tf.Tensor, seed: tf.Tensor
  ) -> tf.Tensor:
    """The estimate after a round in which `below` clients (summed) had norms within
    the reported bound."""
    n = clients if self.denominator is None else tf.constant(self.denominator, tf.float32)
    noise = tf.random.stateless_normal([], seed, stddev=self.count_stddev)
    fraction = tf.clip_by_value(
      tf.math.divide_no_nan(below - 0.5 * clients + noise, n) + 0.5, 0.0, 1.0
    )
    return tf.maximum(estimate * tf.exp(-self.learning_rate * (fraction - self.target)), 0.0)


class Clip(base.Stage):
  """L2 clipping to C (fixed, or `adaptive`), optionally the Gaussian mechanism with
  `noise_multiplier` z (module docstring). `private`: measurements named as TFF's DP
  factories' (`dp_query_metrics/clip`, the next bound)."""

  name = 'clip'
  in_state = ('norm',)

  def __init__(
    self,
    norm: float,
    *,
    adaptive: Quantile | None = None,
    noise_multiplier: float = 0.0,
    private: bool = False,
  ):
    if not norm > 0:
      raise ValueError(f'a clip norm must be > 0, got {norm}.')
    if not noise_multiplier >= 0:
      raise ValueError(f'a noise multiplier must be >= 0, got {noise_multiplier}.')
    self.norm, self.adaptive, self.noise_multiplier = norm, adaptive, noise_multiplier
    self.private = private or noise_multiplier > 0
    self.randomized = noise_multiplier > 0 or (adaptive is not None and adaptive.count_stddev > 0)

  def initial_state(self):
    return tf.constant(self.norm, tf.float32)

  def _in_force(self, state: tf.Tensor) -> tf.Tensor:
    return state if self.adaptive is None else self.adaptive.report(state)

  def encode(self, state, x, weights, rows, seeds):
    bound = self._in_force(state)
    norms = tf.norm(x, axis=1)
    # As tf.clip_by_global_norm: x C / max(||x||, C).
    clipped = x * (bound / tf.maximum(norms, bound))[:, None]
    return base.Encoded(
      clipped,
      weights,
      rows,
      {
        'clipped': tf.cast(norms > bound, tf.float32),
        'norm': norms,
        # The quantile's estimate is compared with the norms (its report clips).
        'below': tf.cast(norms <= state, tf.float32),
      },
    )

  def decode(self, state, y, counts, context, seed):
    bound = self._in_force(state)
    value_seed, count_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
    if self.noise_multiplier:
      noise = tf.random.stateless_normal(
        tf.shape(y), value_seed, stddev=self.noise_multiplier * bound
      )
      y = y + noise * context.scale
    measurements = base.Measurements(
      clipping_norm=bound,
      clipped_count=tf.cast(counts['clipped'], tf.int32),
      mean_update_norm=tf.math.divide_no_nan(counts['norm'], context.clients),
    )
    if self.adaptive is not None:
      state = self.adaptive.next(state, counts['below'], context.clients, count_seed)
      if self.private:
        measurements['dp_query_metrics'] = base.Measurements(clip=self._in_force(state))
    return y, state, measurements

  def why_not(self, chain) -> str:
    return base.noises_a_sum(chain, 'the Gaussian mechanism') if self.noise_multiplier else ''


class Zeroing(base.Stage):
  """Rows of norm above Z (fixed, or `adaptive`) or not finite become zero, their
  weights kept (module docstring); `order` 1, 2 or inf."""

  name = 'zeroing'
  in_state = ('norm',)

  def __init__(self, norm: float, *, order: float = math.inf, adaptive: Quantile | None = None):
    if order not in (1.0, 2.0, math.inf):
      raise ValueError(f"zeroing's norm order is 1, 2 or inf, got {order}.")
    if not norm > 0:
      raise ValueError(f'a zeroing norm must be > 0, got {norm}.')
    self.norm, self.order, self.adaptive = norm, order, adaptive

  def initial_state(self):
    return tf.constant(self.norm, tf.float32)

  def _in_force(self, state):
    return state if self.adaptive is None else self.adaptive.report(state)

  def encode(self, state, x, weights, rows, seeds):
    bound = self._in_force(state)
    norms = tf.norm(tf.where(tf.math.is_finite(x), x, 0.0), ord=self.order, axis=1)
    finite = tf.reduce_all(tf.math.is_finite(x), axis=1)
    zero = tf.logical_or(norms > bound, tf.logical_not(finite))
    kept = tf.where(zero[:, None], tf.zeros_like(x), x)
    return base.Encoded(
      kept,
      weights,
      rows,
      {
        'zeroed': tf.cast(zero, tf.float32),
        # The quantile's estimate is compared with the finite rows' norms (a non-finite
        # row counts above it).
        'below': tf.cast(tf.logical_and(finite, norms <= state), tf.float32),
      },
    )

  def decode(self, state, y, counts, context, seed):
    measurements = base.Measurements(
      zeroing_norm=self._in_force(state), zeroed_count=tf.cast(counts['zeroed'], tf.int32)
    )
    if self.adaptive is not None:
      state = self.adaptive.next(state, counts['below'], context.clients, seed)
    return y, state, measurements
