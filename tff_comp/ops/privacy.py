"""Clipping and differential privacy for the model delta (the `--aggregator` choices
clip, dp, dp_adaptive, dp_ftrl_tree and dp_bandmf), as a chain of the aggregator blocks
(`PrivateMean.chain`, `ops.aggregators`) that every runtime runs.
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

    dp_ftrl_tree (sum_i clip(u_i, C) + z C (N(t) - N(t - 1))) / n, N(t) the noise of
                 the prefix sum of rounds 1..t from a binary tree of Gaussian nodes,
                 restarted every k rounds (DP-FTRL, Kairouz et al. 2021;
                 `aggregators.TreeNoise`; an SGD server step on it is the FTRL step)
                 (TFF: `DifferentiallyPrivateFactory` on TFP's `TreeResidualSumQuery`)
    dp_bandmf    (sum_i clip(u_i, C) + z C w_t) / n, w_t = (S^{-1} g)_t, g_t ~ N(0, I):
                 noise correlated across rounds by a banded factorization A = B S of
                 the prefix sums (BandMF, Choquette-Choo et al. 2023; the `strategy` S,
                 `ops.matrix_factorization`; `aggregators.BandedNoise`)
                 (TFF: the chain placed as a factory)

With a `noise_cohort_size` M (pfl-research's), the noise of dp, dp_ftrl_tree and
dp_bandmf on the sum is scaled by n / M: the mean then has the noise a cohort of M
clients would give it, so a simulation of n clients a round trains with the noise of M
(its privacy accounted for M).

clip(u, C) = u min(1, C / ||u||) with ||.|| the global L2 norm over the update's
tensors; n is the expected number of clients per round (the denominator TFF's DP
queries use, also under Poisson sampling); the DP mechanisms weigh every client alike.
"""

import dataclasses
import typing
from typing import ClassVar

from tff_comp import registry
from tff_comp.ops import aggregators, matrix_factorization, messages


@dataclasses.dataclass(frozen=True)
class PrivateMean:
  """A clipped (optionally noised) mean of the model delta, as a chain (`chain`); each
  mechanism of the module docstring is a subclass registered under the name
  `--aggregator` calls it (`registry.register_mechanism`). `clip_norm`: C.

  What the settings and the accounting read off a mechanism's class, never its name:
  `private` (a Gaussian mechanism: uniform weights, accounted), `cohort_scaled` (takes
  a `noise_cohort_size`), `adaptive` (its clip follows a quantile), `correlated` (noise
  correlated across rounds, no sampling assumed: accounted over cyclic epochs), and its
  fields (a `restart_every`, a `strategy`)."""

  private: ClassVar[bool] = False
  cohort_scaled: ClassVar[bool] = False
  adaptive: ClassVar[bool] = False
  correlated: ClassVar[bool] = False

  clip_norm: float

  def __post_init__(self):
    if not self.clip_norm > 0:
      raise ValueError(f'clip_norm must be > 0, got {self.clip_norm}.')

  @property
  def name(self) -> str:
    """What `--aggregator` calls it."""
    return registry.MECHANISMS.name_of(type(self))

  def chain(self) -> aggregators.Chain:
    """This mean as a chain of the aggregator blocks (`ops.aggregators`). Measurements as
    TFF's factories name them: clipping_norm, clipped_count, and for dp_adaptive
    dp_query_metrics/clip (the next round's clip); also mean_update_norm (a
    simulation's diagnostic: the un-noised norms are not private)."""
    raise NotImplementedError


@registry.register_mechanism('clip')
@dataclasses.dataclass(frozen=True)
class ClippedMean(PrivateMean):
  """Each client's update clipped to --clip_norm, then the weighted mean (no noise)."""

  def chain(self) -> aggregators.Chain:
    return aggregators.Chain((aggregators.Clip(self.clip_norm),), aggregators.Mean())


@dataclasses.dataclass(frozen=True)
class NoisedMean(PrivateMean):
  """The clipped sum with Gaussian noise, over n: the mechanisms' shared fields.

  noise_multiplier: z, the effective total noise multiplier. clients_per_round: n.
  noise_cohort_size: M, the cohort the noise is calibrated to (`cohort_scaled`
  mechanisms; None: n)."""

  private: ClassVar[bool] = True
  cohort_scaled: ClassVar[bool] = True

  noise_multiplier: float = 0.0
  clients_per_round: float = 1.0
  noise_cohort_size: float | None = None

  def __post_init__(self):
    super().__post_init__()
    if not self.noise_multiplier >= 0:
      raise ValueError(f'noise_multiplier must be >= 0, got {self.noise_multiplier}.')
    if not self.clients_per_round > 0:
      raise ValueError(f'clients_per_round must be > 0, got {self.clients_per_round}.')
    if self.noise_cohort_size is not None:
      if not self.cohort_scaled:
        raise ValueError(f'noise_cohort_size does not apply to {self.name}.')
      if not self.noise_cohort_size >= self.clients_per_round:
        raise ValueError(
          f'noise_cohort_size ({self.noise_cohort_size}) simulates a cohort at least the'
          f' one of a round ({self.clients_per_round}).'
        )

  @property
  def noise_scale(self) -> float:
    """n / M: the factor on the sum's noise for a `noise_cohort_size` M (else 1)."""
    if self.noise_cohort_size is None:
      return 1.0
    return self.clients_per_round / self.noise_cohort_size

  @property
  def stddev(self) -> float:
    """The standard deviation of the noise on the sum: z C n / M."""
    return self.noise_multiplier * self.noise_scale * self.clip_norm

  def _sum(self, noise: aggregators.Stage | None = None) -> aggregators.Chain:
    """The privately clipped sum over n, `noise` after the clip."""
    clip = aggregators.Clip(self.clip_norm, private=True)
    return aggregators.Chain(
      (clip,) if noise is None else (clip, noise),
      aggregators.Mean(denominator=self.clients_per_round),
    )


@registry.register_mechanism('dp')
@dataclasses.dataclass(frozen=True)
class GaussianMean(NoisedMean):
  """Clipped, summed, Gaussian noise of std noise_multiplier x clip_norm, divided by
  --clients_per_round (TFF's DP-FedAvg semantics, uniform client weights)."""

  def chain(self) -> aggregators.Chain:
    clip = aggregators.Clip(
      self.clip_norm, noise_multiplier=self.noise_multiplier * self.noise_scale, private=True
    )
    return aggregators.Chain((clip,), aggregators.Mean(denominator=self.clients_per_round))


@registry.register_mechanism('dp_adaptive')
@dataclasses.dataclass(frozen=True)
class AdaptiveGaussianMean(NoisedMean):
  """As dp, with the clip adapting to --clip_quantile of the update norms.

  noise_multiplier covers the clipped-count query too, as TFF's
  (`value_noise_multiplier` is what the update gets). target_quantile,
  clip_learning_rate, clipped_count_stddev: the quantile estimate (TFF's defaults;
  stddev None: `count_stddev`'s default)."""

  cohort_scaled: ClassVar[bool] = False
  adaptive: ClassVar[bool] = True

  target_quantile: float = 0.5
  clip_learning_rate: float = 0.2
  clipped_count_stddev: float | None = None

  def __post_init__(self):
    super().__post_init__()
    if not 0 <= self.target_quantile <= 1:
      raise ValueError(f'target_quantile must be in [0, 1], got {self.target_quantile}.')
    if self.clipped_count_stddev is not None and not self.clipped_count_stddev >= 0:
      raise ValueError(f'clipped_count_stddev must be >= 0, got {self.clipped_count_stddev}.')
    if not self.clip_learning_rate >= 0:
      raise ValueError(f'clip_learning_rate must be >= 0, got {self.clip_learning_rate}.')
    if self.noise_multiplier and self.noise_multiplier >= 2 * self.count_stddev:
      raise ValueError(
        f'noise_multiplier={self.noise_multiplier:.4g} needs clipped_count_stddev >'
        f' {self.noise_multiplier / 2:.3g} (it is {self.count_stddev:.3g}; default 0.05 x'
        ' clients_per_round): adaptive clipping spends part of the noise on the'
        ' clipped count.'
      )

  @property
  def count_stddev(self) -> float:
    """s, the noise on the clipped count: TFF's default 0.05 n, or z where that is at
    most z / 2 (small cohorts: TFF's default would leave the update no noise budget,
    z_v^-2 = z^-2 - (2 s)^-2 <= 0; with s = z, z_v = 1.15 z); 0 for z = 0. The privacy
    spent is z's either way."""
    if self.clipped_count_stddev is not None:
      return self.clipped_count_stddev
    z, tffs = self.noise_multiplier, 0.05 * self.clients_per_round
    return 0.0 if not z else tffs if tffs > z / 2 else z

  @property
  def value_noise_multiplier(self) -> float:
    """z_v with z_v^-2 = z^-2 - (2 s)^-2, so that the two queries together spend z (as
    TFF's `differential_privacy.adaptive_clip_noise_params`, which tests compare)."""
    z = self.noise_multiplier
    return z if z == 0 else (z**-2 - (2 * self.count_stddev) ** -2) ** -0.5

  def chain(self) -> aggregators.Chain:
    adaptive = aggregators.Quantile(
      self.target_quantile,
      self.clip_learning_rate,
      count_stddev=self.count_stddev,
      denominator=self.clients_per_round,
    )
    clip = aggregators.Clip(
      self.clip_norm,
      adaptive=adaptive,
      noise_multiplier=self.value_noise_multiplier,
      private=True,
    )
    return aggregators.Chain((clip,), aggregators.Mean(denominator=self.clients_per_round))


@registry.register_mechanism('dp_ftrl_tree')
@dataclasses.dataclass(frozen=True)
class TreeNoisedMean(NoisedMean):
  """DP-FTRL: the clipped sum with the noise of a binary tree over the rounds, no
  sampling assumed (--sampling=cyclic, --restart_every).

  restart_every: the rounds of a tree (0: one tree)."""

  correlated: ClassVar[bool] = True

  restart_every: int = 0

  def __post_init__(self):
    super().__post_init__()
    if not self.restart_every >= 0:
      raise ValueError(f'restart_every must be >= 0, got {self.restart_every}.')

  def chain(self) -> aggregators.Chain:
    return self._sum(aggregators.TreeNoise(self.stddev, restart_every=self.restart_every))


@registry.register_mechanism('dp_bandmf')
@dataclasses.dataclass(frozen=True)
class BandedNoisedMean(NoisedMean):
  """BandMF: the clipped sum with noise correlated across the rounds by a banded matrix
  factorization, no sampling assumed (--sampling=cyclic, --bands).

  strategy: the factorization (`matrix_factorization.Strategy`), one row a round."""

  correlated: ClassVar[bool] = True

  strategy: matrix_factorization.Strategy | None = None

  def __post_init__(self):
    super().__post_init__()
    if self.strategy is None:
      raise ValueError('dp_bandmf needs its strategy (the factorization).')

  def chain(self) -> aggregators.Chain:
    strategy = typing.cast(matrix_factorization.Strategy, self.strategy)  # __post_init__'s
    return self._sum(aggregators.BandedNoise(self.stddev, strategy))


def check_uniform(algorithm, *, private: bool) -> None:
  """Raises ValueError (one line) unless an unweighted model aggregator (DP, a robust
  combiner; TFF's DP factories) computes `algorithm`'s aggregation: uniform client
  weights, no per-client weights of the rule, and for a `private` one no model-sized
  client state reported beside the delta (it would leave un-noised)."""
  name = type(algorithm.client_rule).__name__
  what = 'differential privacy' if private else 'a robust combiner'
  if algorithm.client_rule.weighs_clients:
    raise ValueError(
      f"an unweighted model aggregator ({what}) cannot apply {name}'s per-client weights."
    )
  if algorithm.client_options.weighting != 'uniform':
    raise ValueError(
      f'an unweighted model aggregator ({what}) weighs every'
      " client alike: use client_weighting='uniform'."
    )
  if private and messages.reports_client_state(algorithm.server_rule.update_spec()):
    raise ValueError(
      f'{name} reports model-sized client state beside its delta, which an'
      ' unweighted (DP) model aggregator would leave un-noised; refused.'
    )
