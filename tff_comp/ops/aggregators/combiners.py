"""Combiners: how a cohort's encoded rows y_i [d] (weights w_i) become one vector.

    Mean             sum_i w_i y_i / sum_i w_i  (weighted; decomposable), or, with a
                     `denominator` n, sum_i y_i / n (DP's, every client alike)
    MajorityVote     s sign(sum_i sign(y_i)), s the clients' mean max |y_ij| (signSGD
                     with majority vote, Bernstein et al. 2019; decomposable: the signs
                     and scales add)
    Median           coordinate-wise median (Yin et al. 2018)
    TrimmedMean      coordinate-wise mean of the rows left once the b = floor(beta m)
                     largest and b smallest values of each coordinate are dropped
                     (Yin et al. 2018)
    Krum             the row minimizing the sum of squared distances to its m - f - 2
                     nearest others; Multi-Krum (`select` > 1): the mean of the `select`
                     rows of lowest such score (Blanchard et al. 2017)
    GeometricMedian  argmin_v sum_i ||v - y_i|| by the smoothed Weiszfeld iteration
                     v <- sum_i b_i y_i / sum_i b_i, b_i = 1 / max(nu, ||v - y_i||),
                     from the mean (RFA, Pillutla et al. 2022)
    CenteredClip     v <- v + (1/m) sum_i (y_i - v) min(1, tau / ||y_i - v||), `iters`
                     times from the previous round's result (Karimireddy et al. 2021)

The robust combiners (Median to CenteredClip) and MajorityVote count every client alike;
the robust ones need every row, and survive any single row a client can send: a NaN
value sorts as +inf for the coordinate-wise ones, a row holding a non-finite value is
farther than any other from every row for Krum (and Bulyan), and weighs nothing in the
geometric median and centered clipping; distances and norms are taken in float64, from
the finite row of median norm, so that huge rows (1e20: float32 squares
overflow) and rows far from the origin (||a||^2 + ||b||^2 - 2ab cancels) are measured
exactly enough.

Each robust combiner registers what `--aggregator` calls it, with its settings record
(`registry.register_combiner`: the record's fields become its flags).
"""

import dataclasses
from typing import Any, NamedTuple

import numpy as np
import tensorflow as tf

from tff_comp import registry, settings
from tff_comp.ops.aggregators import base


class MeanSums(NamedTuple):
  """A share's weighted sum of rows and its weight (its clients for `denominator`)."""

  total: tf.Tensor
  weight: tf.Tensor


class Mean(base.Combiner):
  """The weighted mean; with `denominator` n, the rows' plain sum over n (the
  denominator TFF's DP queries use: the expected clients of a round). 0 for a cohort of
  total weight 0 (clients without examples), as TFF's `MeanFactory(no_nan_division)`."""

  name = 'mean'
  scaled_sum = True

  def __init__(self, denominator: float | None = None):
    if denominator is not None and not denominator > 0:
      raise ValueError(f"a mean's denominator must be > 0, got {denominator}.")
    self.denominator = denominator
    self.weighted = denominator is None

  def sums(self, state, values, weights) -> MeanSums:
    if self.denominator is not None:
      return MeanSums(tf.reduce_sum(values, 0), tf.cast(tf.shape(values)[0], tf.float32))
    return MeanSums(tf.linalg.matvec(values, weights, transpose_a=True), tf.reduce_sum(weights))

  def from_sums(self, state, total: MeanSums):
    if self.denominator is not None:
      scale = tf.constant(1.0 / self.denominator, tf.float32)
    else:
      scale = tf.math.divide_no_nan(1.0, total.weight)
    return total.total * scale, scale, state, base.Measurements()


class VoteSums(NamedTuple):
  signs: tf.Tensor  # sum_i sign(y_i)
  scale: tf.Tensor  # sum_i max_j |y_ij|
  clients: tf.Tensor


class MajorityVote(base.Combiner):
  """signSGD's majority vote (module docstring); rows are signs scaled per client (the
  `compression.Sign` stage's), so max |y_ij| is the client's scale."""

  name = 'majority_vote'
  weighted = False

  def sums(self, state, values, weights) -> VoteSums:
    return VoteSums(
      tf.reduce_sum(tf.sign(values), 0),
      tf.reduce_sum(tf.reduce_max(tf.abs(values), 1)),
      tf.cast(tf.shape(values)[0], tf.float32),
    )

  def from_sums(self, state, total: VoteSums):
    scale = tf.math.divide_no_nan(total.scale, total.clients)
    return scale * tf.sign(total.signs), None, state, base.Measurements()


class _Robust(base.Combiner):
  """A combiner needing every row, every client alike."""

  decomposable = False
  weighted = False


def finite_rows(values: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
  """[m] whether each row is all finite, and the rows with the others zeroed."""
  finite = tf.reduce_all(tf.math.is_finite(values), 1)
  return finite, tf.where(finite[:, None], values, tf.zeros_like(values))


def row_norms(values: tf.Tensor) -> tf.Tensor:
  """[m] Euclidean norms of finite rows, in float64 (a float32 norm of a row of 1e20s
  overflows to inf)."""
  return tf.norm(tf.cast(values, tf.float64), axis=1)


def nan_as_inf(values: tf.Tensor) -> tf.Tensor:
  """NaN values as +inf: sorted, a NaN row is one more value at the top (tf.sort leaves
  NaNs' places unspecified)."""
  return tf.where(tf.math.is_nan(values), tf.constant(float('inf'), values.dtype), values)


class Median(_Robust):
  """The coordinate-wise median (the mean of the two middle values for even m)."""

  name = 'median'

  def min_rows(self) -> tuple[int, str]:
    return 3, 'the median of two rows is their mean'

  def combine(self, state, values, weights):
    return median(nan_as_inf(values)), None, state, base.Measurements()


def median(values: tf.Tensor) -> tf.Tensor:
  """The coordinate-wise median of the rows (of float32 or float64 values, NaN-free)."""
  ordered = tf.sort(values, axis=0)
  m = tf.shape(values)[0]
  return 0.5 * (tf.gather(ordered, (m - 1) // 2) + tf.gather(ordered, m // 2))


class TrimmedMean(_Robust):
  """The coordinate-wise beta-trimmed mean: b = floor(beta m) values dropped at each end
  of every coordinate (at most leaving one)."""

  name = 'trimmed_mean'
  in_state = ('beta',)

  def __init__(self, beta: float = 0.1):
    if not 0 <= beta < 0.5:
      raise ValueError(f"the trimmed mean's beta must be in [0, 0.5), got {beta}.")
    self.beta = beta

  def initial_state(self) -> tf.Tensor:
    return tf.constant(self.beta, tf.float32)

  def min_rows(self) -> tuple[int, str]:
    if not self.beta:
      return 1, ''  # the mean, asked for
    # The least m whose b drops a value, in `combine`'s float32 arithmetic.
    m = max(int(1 / self.beta) - 1, 1)
    while np.floor(np.float32(self.beta) * np.float32(m)) < 1:
      m += 1
    return m, f'it drops floor({self.beta:g} m) values at each end of a coordinate, none of fewer'

  def combine(self, state, values, weights):
    m = tf.shape(values)[0]
    b = tf.minimum(tf.cast(tf.floor(state * tf.cast(m, tf.float32)), tf.int32), (m - 1) // 2)
    kept = tf.sort(nan_as_inf(values), axis=0)[b : m - b]
    return tf.reduce_mean(kept, 0), None, state, base.Measurements()


# The squared distance between a row holding a non-finite value and any other row: above
# any between finite float32 rows (< 1e82), and m of them still sum below float64's max.
FAR = 1e250


def squared_distances(values: tf.Tensor) -> tf.Tensor:
  """[m, m] float64 squared Euclidean distances between the rows, `FAR` to and from a
  row holding a non-finite value. Taken from a point amid the finite rows, as ||a||^2 +
  ||b||^2 - 2ab is fast but cancels far from the origin (Krum chose a row of non-minimal
  score at offset/spread 1e4), and in float64, where 1e20^2 is finite."""
  finite, rows = finite_rows(values)
  rows = tf.cast(rows, tf.float64)
  # Any point amid the rows serves as the origin: the finite row of median norm (a top-k
  # of m norms; a coordinate-wise median, a sort of d columns, doubled Krum's cost),
  # which a few huge rows cannot move. Chosen for few ops: on a cohort of 10 rows each
  # op costs more to dispatch than its arithmetic (docs/speed.md, part 9).
  norms = tf.where(finite, tf.reduce_sum(tf.square(rows), 1), tf.constant(float('inf'), tf.float64))
  middle = tf.math.top_k(-norms, (tf.shape(norms)[0] + 1) // 2).indices[-1]
  rows = rows - rows[middle][None, :]
  norms = tf.reduce_sum(tf.square(rows), 1)
  distances = tf.maximum(
    norms[:, None] + norms[None, :] - 2.0 * tf.matmul(rows, rows, transpose_b=True), 0.0
  )
  distances = 0.5 * (distances + tf.transpose(distances))  # exactly symmetric: ties by position
  both = tf.logical_and(finite[:, None], finite[None, :])
  apart = tf.where(both, distances, tf.constant(FAR, tf.float64))
  return tf.linalg.set_diag(apart, tf.zeros_like(norms))


class Krum(_Robust):
  """Krum / Multi-Krum (module docstring) for at most `byzantine` f attackers; `select`
  rows averaged (1: Krum). Measurements `krum_selected`: how many rows were averaged;
  `krum_clamped`: 1 in a round whose cohort m is below the rule's 2f + 3 (or Multi-Krum's
  `select`), where each row's m - f - 2 nearest (at least one) and at most m rows are
  taken (the settings refuse such a cohort; dropouts and Poisson sampling make one)."""

  name = 'krum'
  selects = True
  in_state = ('byzantine', 'select')

  def __init__(self, byzantine: int = 0, select: int = 1):
    if byzantine < 0 or select < 1:
      raise ValueError(f'Krum needs byzantine >= 0 and select >= 1, got {byzantine}, {select}.')
    self.byzantine, self.select = byzantine, select
    self.name = 'krum' if select == 1 else 'multi_krum'

  def initial_state(self) -> tf.Tensor:
    return tf.constant([self.byzantine, self.select], tf.int32)  # f, the rows averaged

  def min_rows(self) -> tuple[int, str]:
    f = self.byzantine
    if self.select > 2 * f + 3:
      return self.select, f'it averages the {self.select} rows of lowest score'
    return 2 * f + 3, f'2 f + 3 with f = {f}'

  def combine(self, state, values, weights):
    m = tf.shape(values)[0]
    distances = squared_distances(values)
    # Each row's m - f - 2 nearest others (at least one), and itself (0): the smallest.
    nearest = tf.minimum(tf.maximum(m - state[0] - 2, 1) + 1, m)
    scores = -tf.reduce_sum(tf.math.top_k(-distances, nearest).values, 1)
    chosen = tf.minimum(state[1], m)
    best = tf.math.top_k(-scores, chosen).indices  # the lowest; ties by position
    result = tf.reduce_mean(tf.gather(values, best), 0)
    clamped = tf.logical_or(m < 2 * state[0] + 3, state[1] > m)
    share = tf.fill([chosen], 1.0 / tf.cast(chosen, tf.float32))
    return (
      result,
      None,
      state,
      base.Measurements(
        krum_selected=tf.cast(chosen, tf.float32),
        krum_clamped=tf.cast(clamped, tf.float32),
        **{base.ROWS_SELECTED: tf.scatter_nd(best[:, None], share, [m])},
      ),
    )


class GeometricMedian(_Robust):
  """The geometric median by `iters` smoothed Weiszfeld steps with smoothing `nu`
  (RFA's); measurement `geometric_median_iterations`."""

  name = 'geometric_median'

  def min_rows(self) -> tuple[int, str]:
    return 3, 'the geometric median of two rows is any point between them (here their mean)'

  def __init__(self, iters: int = 10, nu: float = 1e-6):
    if iters < 1 or not nu > 0:
      raise ValueError(f'the geometric median needs iters >= 1 and nu > 0, got {iters}, {nu}.')
    self.iters, self.nu = iters, nu

  def combine(self, state, values, weights):
    finite, rows = finite_rows(values)
    # From the coordinate-wise median (RFA starts from the mean, where one row of 1e20
    # drags it: 10 steps then leave it near 1e10); the minimizer is the same.
    v = median(rows)
    for _ in range(self.iters):
      b = 1.0 / tf.maximum(row_norms(rows - v[None, :]), self.nu)
      b = tf.cast(tf.where(finite, b, 0.0) / tf.reduce_sum(tf.where(finite, b, 0.0)), tf.float32)
      v = tf.linalg.matvec(rows, b, transpose_a=True)
    return (
      v,
      None,
      state,
      base.Measurements(geometric_median_iterations=tf.constant(float(self.iters))),
    )


class CenteredClipState(NamedTuple):
  center: tf.Tensor  # [d], the previous round's result
  tau: tf.Tensor


class CenteredClip(_Robust):
  """Centered clipping (module docstring) with radius `tau`, `iters` steps, centered at
  the previous round's result (its state; zero at first)."""

  name = 'centered_clip'
  in_state = ('tau',)

  def __init__(self, tau: float = 1.0, iters: int = 3):
    if not tau > 0 or iters < 1:
      raise ValueError(f'centered clipping needs tau > 0 and iters >= 1, got {tau}, {iters}.')
    self.tau, self.iters = tau, iters
    self._d: int | None = None

  def initial_state(self) -> CenteredClipState:
    return CenteredClipState(
      tf.zeros([self._d or 0], tf.float32), tf.constant(self.tau, tf.float32)
    )

  def bind(self, d: int) -> 'CenteredClip':
    bound = CenteredClip(self.tau, self.iters)
    bound._d = d
    return bound

  def combine(self, state, values, weights):
    finite, rows = finite_rows(values)
    tau = tf.cast(state.tau, tf.float64)
    v = state.center
    for _ in range(self.iters):
      diff = rows - v[None, :]
      scale = tf.minimum(tf.constant(1.0, tf.float64), tau / tf.maximum(row_norms(diff), 1e-12))
      scale = tf.cast(tf.where(finite, scale, 0.0), tf.float32)  # a non-finite row: no pull
      v = v + tf.reduce_mean(diff * scale[:, None], 0)
    return v, None, state._replace(center=v), base.Measurements()


def byzantine_clients() -> Any:
  """The setting of f, the attackers a round is assumed to have (Krum's, Bulyan's)."""
  return settings.setting(
    1,
    "the attackers f a round is assumed to have (Krum: each row's score sums its"
    ' m - f - 2 nearest others; Bulyan: m - 2f rows chosen, then 2f values a coordinate'
    ' trimmed).',
    lower=0,
    upper=settings.MAX_COUNT,
    per_trial=True,
    chain_state=True,
  )


@registry.register_combiner('median')
def _median(options: None, rows: int) -> Median:
  """The coordinate-wise median."""
  del options, rows
  return Median()


@dataclasses.dataclass(frozen=True)
class TrimmedMeanOptions:
  trim_fraction: float = settings.setting(
    0.1,
    "the fraction of each coordinate's values dropped at each end.",
    lower=0.0,
    upper=0.49,
    per_trial=True,
    chain_state=True,
  )


@registry.register_combiner('trimmed_mean', options=TrimmedMeanOptions)
def _trimmed_mean(options: TrimmedMeanOptions, rows: int) -> TrimmedMean:
  """The coordinate-wise mean once a fraction of each coordinate's values is dropped at
  each end."""
  del rows
  return TrimmedMean(options.trim_fraction)


@dataclasses.dataclass(frozen=True)
class KrumOptions:
  byzantine_clients: int = byzantine_clients()


@registry.register_combiner('krum', options=KrumOptions)
def _krum(options: KrumOptions, rows: int) -> Krum:
  """The row nearest its m - f - 2 nearest others (Blanchard et al. 2017; m > 2f + 2)."""
  del rows
  return Krum(options.byzantine_clients)


@dataclasses.dataclass(frozen=True)
class MultiKrumOptions:
  byzantine_clients: int = byzantine_clients()
  multi_krum_select: int | None = settings.setting(
    None,
    'the rows of lowest score averaged (default m - f).',
    lower=1,
    upper=settings.MAX_COUNT,
    per_trial=True,
    chain_state=True,
  )


@registry.register_combiner('multi_krum', options=MultiKrumOptions)
def _multi_krum(options: MultiKrumOptions, rows: int) -> Krum:
  """The mean of the rows of lowest Krum score (m > 2f + 2)."""
  f = options.byzantine_clients
  return Krum(f, options.multi_krum_select or max(1, rows - f))


@dataclasses.dataclass(frozen=True)
class GeometricMedianOptions:
  geometric_median_iters: int = settings.setting(
    10, 'smoothed Weiszfeld iterations.', lower=1, upper=1000
  )


@registry.register_combiner('geometric_median', options=GeometricMedianOptions)
def _geometric_median(options: GeometricMedianOptions, rows: int) -> GeometricMedian:
  """The geometric median by smoothed Weiszfeld steps (RFA's, every client alike)."""
  del rows
  return GeometricMedian(options.geometric_median_iters)


@dataclasses.dataclass(frozen=True)
class CenteredClipOptions:
  centered_clip_tau: float = settings.setting(
    1.0,
    "the radius tau around the previous round's result.",
    lower=settings.FLOAT32_TINY,
    upper=settings.FLOAT32_HUGE,
    per_trial=True,
    chain_state=True,
  )


@registry.register_combiner('centered_clip', options=CenteredClipOptions)
def _centered_clip(options: CenteredClipOptions, rows: int) -> CenteredClip:
  """Centered clipping around the previous round's result (Karimireddy et al. 2021)."""
  del rows
  return CenteredClip(options.centered_clip_tau)
