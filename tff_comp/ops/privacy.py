"""Clipping and differential privacy for the model delta, in pure TF over a cohort's
deltas stacked along a leading client axis (the in-process runtime).
`tff_comp.learning_process.aggregation_factories.privacy_factory` maps a `PrivateMean`
to the TFF factory with the same semantics, which TFF's runtime runs:

    clip         sum_i w_i clip(u_i, C) / sum_i w_i
                 (`tff.aggregators.clipping_factory(C, MeanFactory())`)
    dp           (sum_i clip(u_i, C) + N(0, (z C)^2 I)) / n
                 (`DifferentiallyPrivateFactory.gaussian_fixed(z, n, C)`)
    dp_adaptive  as dp with the value noise multiplier z_v, then the clip moves to a
                 quantile of the update norms (Andrew et al. 2021, geometric update):
                   b = clamp((sum_i [||u_i|| <= C] - 1/2 + N(0, s^2)) / n + 1/2, 0, 1)
                   C <- C exp(-lr (b - target_quantile))
                 (`DifferentiallyPrivateFactory.gaussian_adaptive(z, n, C, ...)`)

clip(u, C) = u min(1, C / ||u||) with ||.|| the global L2 norm over the update's
tensors; n is the expected number of clients per round (the denominator TFF's DP
queries use, also under Poisson sampling); the DP kinds weigh every client alike.
"""

import collections
import dataclasses
from typing import Any

import tensorflow as tf

from tff_comp.ops import messages

CLIP, DP, DP_ADAPTIVE = 'clip', 'dp', 'dp_adaptive'
KINDS = (CLIP, DP, DP_ADAPTIVE)
# Salt of the noise's seed, so the server's noise draws never repeat a client's draws
# of the same run seed.
_NOISE_SALT = 0x5EED_D9


@dataclasses.dataclass(frozen=True)
class PrivateMean:
  """A clipped (optionally noised) mean of the model delta; see the module docstring.

  kind: one of `KINDS`. clip_norm: C (the initial clip for dp_adaptive).
  noise_multiplier: z, the effective total noise multiplier (for dp_adaptive it covers
  the clipped-count query too, as TFF's; `value_noise_multiplier` is what the update
  gets). clients_per_round: n. target_quantile, clip_learning_rate,
  clipped_count_stddev: dp_adaptive's quantile estimate (TFF's defaults; stddev None:
  `count_stddev`'s default).
  """

  kind: str
  clip_norm: float
  noise_multiplier: float = 0.0
  clients_per_round: float = 1.0
  target_quantile: float = 0.5
  clip_learning_rate: float = 0.2
  clipped_count_stddev: float | None = None

  def __post_init__(self):
    if self.kind not in KINDS:
      raise ValueError(f'aggregator {self.kind!r} is unknown; choose one of {KINDS}.')
    if not self.clip_norm > 0:
      raise ValueError(f'clip_norm must be > 0, got {self.clip_norm}.')
    if not self.noise_multiplier >= 0:
      raise ValueError(f'noise_multiplier must be >= 0, got {self.noise_multiplier}.')
    if self.kind == CLIP and self.noise_multiplier:
      raise ValueError('the clip aggregator adds no noise; use dp for a noise_multiplier.')
    if not self.clients_per_round > 0:
      raise ValueError(f'clients_per_round must be > 0, got {self.clients_per_round}.')
    if not 0 <= self.target_quantile <= 1:
      raise ValueError(f'target_quantile must be in [0, 1], got {self.target_quantile}.')
    if self.clipped_count_stddev is not None and not self.clipped_count_stddev >= 0:
      raise ValueError(f'clipped_count_stddev must be >= 0, got {self.clipped_count_stddev}.')
    if not self.clip_learning_rate >= 0:
      raise ValueError(f'clip_learning_rate must be >= 0, got {self.clip_learning_rate}.')
    if self.kind == DP_ADAPTIVE and self.noise_multiplier:
      stddev = self.count_stddev
      if self.noise_multiplier >= 2 * stddev:
        raise ValueError(
          f'noise_multiplier={self.noise_multiplier:.4g} needs clipped_count_stddev >'
          f' {self.noise_multiplier / 2:.3g} (it is {stddev:.3g}; default 0.05 x'
          ' clients_per_round): adaptive clipping spends part of the noise on the'
          ' clipped count.'
        )

  @property
  def private(self) -> bool:
    """Whether this mean is a Gaussian mechanism (uniform weights, accounted)."""
    return self.kind != CLIP

  @property
  def count_stddev(self) -> float:
    """s, the noise on dp_adaptive's clipped count: TFF's default 0.05 n, or z where that
    is at most z / 2 (small cohorts: TFF's default would leave the update no noise
    budget, z_v^-2 = z^-2 - (2 s)^-2 <= 0; with s = z, z_v = 1.15 z); 0 for z = 0. The
    privacy spent is z's either way."""
    if self.clipped_count_stddev is not None:
      return self.clipped_count_stddev
    z, tffs = self.noise_multiplier, 0.05 * self.clients_per_round
    return 0.0 if not z else tffs if tffs > z / 2 else z

  @property
  def value_noise_multiplier(self) -> float:
    """The noise multiplier of the update's sum: z, or for dp_adaptive z_v with
    z_v^-2 = z^-2 - (2 s)^-2, so that the two queries together spend z (as TFF's
    `differential_privacy.adaptive_clip_noise_params`, which tests compare)."""
    z = self.noise_multiplier
    if self.kind != DP_ADAPTIVE or z == 0:
      return z
    return (z**-2 - (2 * self.count_stddev) ** -2) ** -0.5

  def initial_state(self) -> collections.OrderedDict:
    """The aggregator's state: the clip norm in force."""
    return collections.OrderedDict(clip_norm=tf.constant(self.clip_norm, tf.float32))

  def aggregate(
    self, state, deltas: Any, weights: tf.Tensor, seed: tf.Tensor
  ) -> tuple[Any, collections.OrderedDict, collections.OrderedDict]:
    """(the mean of the stacked `deltas`, the new state, measurements) for one round;
    `seed` ([2] int) draws the noise, so a round's noise is fixed by the run and round.

    Measurements: clipping_norm (the clip used), clipped_count, and for dp_adaptive
    dp_query_metrics/clip (the next round's clip), as TFF's factories name them; also
    mean_update_norm (a simulation's diagnostic: the un-noised norms are not private).
    """
    return self.from_sums(state, self.sums(state, deltas, weights), seed)

  def sums(self, state, deltas: Any, weights: tf.Tensor) -> collections.OrderedDict:
    """A share of the cohort's clipped updates, summed (weighted by `weights` for clip,
    the Gaussian mechanisms' sum unweighted), with the counts the round needs: added
    across shares (Ray's actors) before `from_sums`, which adds the noise once."""
    clip_norm = state['clip_norm']
    clipped, norms = clip(deltas, clip_norm)
    was_clipped = norms > clip_norm
    if self.kind == CLIP:
      summed = tf.nest.map_structure(lambda u: tf.tensordot(weights, u, axes=1), clipped)
    else:
      summed = tf.nest.map_structure(lambda u: tf.reduce_sum(u, axis=0), clipped)
    return collections.OrderedDict(
      total=summed,
      weight=tf.reduce_sum(weights),
      clients=tf.cast(tf.size(norms), tf.float32),
      clipped_count=tf.reduce_sum(tf.cast(was_clipped, tf.int32)),
      norm_sum=tf.reduce_sum(norms),
      below=tf.reduce_sum(tf.cast(~was_clipped, tf.float32) - 0.5),
    )

  def from_sums(
    self, state, total: collections.OrderedDict, seed: tf.Tensor
  ) -> tuple[Any, collections.OrderedDict, collections.OrderedDict]:
    """`aggregate`'s (mean, new state, measurements) from the cohort's `sums`."""
    clip_norm = state['clip_norm']
    measurements = collections.OrderedDict(
      clipping_norm=clip_norm,
      clipped_count=total['clipped_count'],
      mean_update_norm=tf.math.divide_no_nan(total['norm_sum'], total['clients']),
    )
    if self.kind == CLIP:
      mean = tf.nest.map_structure(
        lambda u: tf.math.divide_no_nan(u, total['weight']), total['total']
      )
      return mean, state, measurements
    seeds = tf.random.experimental.stateless_split(
      tf.cast(seed, tf.int64) + tf.constant([_NOISE_SALT, 0], tf.int64), 2
    )
    stddev = clip_norm * self.value_noise_multiplier
    n = tf.constant(self.clients_per_round, tf.float32)
    mean = tf.nest.map_structure(
      lambda summed, noise: (summed + noise) / n,
      total['total'],
      gaussian(total['total'], stddev, seeds[0]),
    )
    if self.kind == DP_ADAPTIVE:
      below = total['below'] + tf.random.stateless_normal([], seeds[1], stddev=self.count_stddev)
      below = tf.clip_by_value(below / n + 0.5, 0.0, 1.0)
      new_clip = tf.maximum(
        clip_norm * tf.exp(-self.clip_learning_rate * (below - self.target_quantile)), 0.0
      )
      state = collections.OrderedDict(clip_norm=new_clip)
      measurements['dp_query_metrics'] = collections.OrderedDict(clip=new_clip)
    return mean, state, measurements


def clip(stacked: Any, clip_norm: tf.Tensor) -> tuple[Any, tf.Tensor]:
  """(every client's update scaled to global L2 norm at most `clip_norm`, the [m] norms
  before clipping), for a structure stacked on axis 0."""
  leaves = tf.nest.flatten(stacked)
  norms = tf.sqrt(
    tf.add_n(
      [
        tf.reduce_sum(tf.reshape(tf.square(leaf), [tf.shape(leaf)[0], -1]), axis=1)
        for leaf in leaves
      ]
    )
  )
  # As tf.clip_by_global_norm: u C / max(||u||, C).
  scale = clip_norm / tf.maximum(norms, clip_norm)
  return tf.nest.map_structure(
    lambda u: u * tf.reshape(scale, [-1] + [1] * (u.shape.rank - 1)), stacked
  ), norms


def gaussian(like: Any, stddev: tf.Tensor, seed: tf.Tensor) -> Any:
  """N(0, stddev^2) noise shaped as every leaf of `like`, a leaf's draw seeded by `seed`
  and its position."""
  leaves = tf.nest.flatten(like)
  noise = [
    tf.random.stateless_normal(
      tf.shape(leaf),
      tf.random.experimental.stateless_fold_in(seed, i),
      stddev=stddev,
      dtype=leaf.dtype,
    )
    for i, leaf in enumerate(leaves)
  ]
  return tf.nest.pack_sequence_as(like, noise)


def check_uniform(algorithm) -> None:
  """Raises ValueError (one line) unless a uniformly weighted model aggregator (TFF's DP
  factories, `PrivateMean`'s DP kinds) computes `algorithm`'s aggregation: uniform client
  weights, no per-client weights of the rule, no model-sized client state reported beside
  the delta (it would leave un-noised)."""
  name = type(algorithm.client_rule).__name__
  if algorithm.client_rule.weighs_clients:
    raise ValueError(
      f'an unweighted model aggregator (differential privacy) cannot'
      f" apply {name}'s per-client weights."
    )
  if algorithm.client_options.weighting != 'uniform':
    raise ValueError(
      'an unweighted model aggregator (differential privacy) weighs every'
      " client alike: use client_weighting='uniform'."
    )
  if messages.reports_client_state(algorithm.server_rule.update_spec()):
    raise ValueError(
      f'{name} reports model-sized client state beside its delta, which an'
      ' unweighted (DP) model aggregator would leave un-noised; refused.'
    )
