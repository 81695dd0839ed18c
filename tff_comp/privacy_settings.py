"""The run's `--aggregator`: what averages the model delta, clipped or differentially
private, and the privacy it spends.

`PrivacyOptions` is the record of these settings; `PrivacyOptions.plan` resolves them
for a run (the clip, the noise multiplier given or calibrated to a target epsilon, the
delta) into the `ops.privacy.PrivateMean` every runtime runs and the
`accounting.Ledger` that counts epsilon; `configure` puts that mean into an algorithm's
arguments. The math is in `ops.privacy`, the accounting
in `accounting`.
"""

import dataclasses
import json
import pathlib
from typing import Any

from tff_comp import accounting, aggregation_settings, registry, settings, strategy_cache
from tff_comp.ops import aggregators, matrix_factorization, privacy
from tff_comp.run import callbacks
from tff_comp.run import sampling as sampling_lib

MEAN = 'mean'  # the algorithm's own aggregation


def aggregator_names() -> tuple[str, ...]:
  """The --aggregator choices: the mean, the DP kinds and every registered combiner."""
  return (MEAN, *privacy.KINDS, *registry.COMBINERS.names())


_NOISE_FLAGS = ('noise_multiplier', 'target_epsilon', 'target_delta')
_ADAPTIVE_FLAGS = ('clip_quantile', 'clip_learning_rate', 'clipped_count_stddev')
DEFAULT_ADAPTIVE_CLIP = 0.1  # TFF's initial_l2_norm_clip
# dp_bandmf's default bands at most: the noise keeps b - 1 model-sized vectors.
DEFAULT_MAX_BANDS = 32


@dataclasses.dataclass(frozen=True)
class Plan:
  """A run's aggregator as resolved: `mean` (None for the algorithm's own), the ledger
  of a DP run, and the values config.json records (`noise_multiplier`, `target_delta`)."""

  mean: privacy.PrivateMean | None
  ledger: accounting.Ledger | None
  resolved: dict[str, float]


@dataclasses.dataclass(frozen=True)
class PrivacyOptions:
  """Clipping and differential privacy of the model delta (side channels stay exact)."""

  aggregator: str = settings.setting(
    MEAN,
    'What combines the model deltas (side channels stay exact): mean (the'
    " algorithm's own); clip (each client's update clipped to --clip_norm, then the"
    ' weighted mean); dp (clipped, summed, Gaussian noise of std noise_multiplier x'
    " clip_norm, divided by --clients_per_round: TFF's DP-FedAvg semantics, uniform"
    ' client weights); dp_adaptive (dp with the clip adapting to --clip_quantile of the'
    ' update norms); dp_ftrl_tree (DP-FTRL: the clipped sum with the noise of a binary'
    ' tree over the rounds, no sampling assumed: --sampling=cyclic, --restart_every);'
    ' dp_bandmf (BandMF: the clipped sum with noise correlated across the rounds by a'
    ' banded matrix factorization, no sampling assumed: --sampling=cyclic, --bands);'
    ' the registered combiners, every client alike (docs/aggregators.md): '
    + aggregation_settings.block_lines(registry.COMBINERS)
    + '.',
    choices=aggregator_names,
  )
  clip_norm: float | None = settings.setting(
    None,
    'L2 norm client updates are clipped to (clip, dp; dp_adaptive: the initial'
    f' clip, default {DEFAULT_ADAPTIVE_CLIP}).',
    per_trial=True,
    chain_state=True,
  )
  noise_multiplier: float | None = settings.setting(
    None,
    'dp, dp_adaptive, dp_ftrl_tree, dp_bandmf: noise std over the clip norm (a tree: of'
    " each node; dp_bandmf: of each round's z_t, the noise added (C^-1 z)_t; dp_adaptive:"
    " the effective total, as TFF's). docs/privacy.md says how to choose it.",
  )
  target_epsilon: float | None = settings.setting(
    None,
    'dp, dp_adaptive, dp_ftrl_tree, dp_bandmf: the privacy budget. Without'
    ' --noise_multiplier, the noise is'
    ' calibrated so that --rounds rounds spend it; with it, the run stops (state saved)'
    ' when it is spent.',
    above=0.0,
  )
  target_delta: float | None = settings.setting(
    None,
    'dp, dp_adaptive, dp_ftrl_tree: the delta epsilon is stated at (default population^-1.1;'
    " must be below 1/population; --delta is Per-FedAvg's finite-difference step).",
  )
  clip_quantile: float = settings.setting(
    0.5, 'dp_adaptive: the quantile of update norms the clip adapts to.'
  )
  clip_learning_rate: float = settings.setting(
    0.2, "dp_adaptive: the clip's geometric learning rate."
  )
  clipped_count_stddev: float | None = settings.setting(
    None,
    'dp_adaptive: noise std of the clipped count (default 0.05 x'
    ' --clients_per_round, or the noise multiplier where that is at most half of it;'
    ' must exceed half the noise multiplier).',
  )
  restart_every: int = settings.setting(
    0,
    'dp_ftrl_tree: rounds of each tree (0: an epoch of --sampling=cyclic, population //'
    ' clients_per_round rounds, the most that keeps each client in one round a tree).',
    lower=0,
    upper=settings.MAX_COUNT,
    applies_when={'aggregator': (privacy.DP_FTRL_TREE,)},
  )
  bands: int = settings.setting(
    0,
    "dp_bandmf: the factorization's bands b, each client's rounds at least b apart (0:"
    f' a cyclic epoch, population // clients_per_round rounds, at most {DEFAULT_MAX_BANDS}'
    ' and --rounds); the noise keeps b - 1 model-sized vectors.',
    lower=0,
    upper=matrix_factorization.MAX_ROUNDS,
    applies_when={'aggregator': (privacy.DP_BANDMF,)},
  )
  noise_cohort_size: int | None = settings.setting(
    None,
    "dp, dp_ftrl_tree, dp_bandmf: the cohort M the noise is calibrated to (pfl-research's"
    " noise_cohort_size): the sum of a round's clients is noised by z C"
    ' clients_per_round / M, the noise a cohort of M would give the mean, and the'
    " accounting counts M clients a round; simulates a large cohort's privacy on a"
    ' small one (default: --clients_per_round).',
    lower=1,
    upper=settings.MAX_COUNT,
    applies_when={'aggregator': privacy.COHORT_SCALED},
  )
  accountant: str = settings.setting(
    'rdp',
    'dp, dp_adaptive, dp_ftrl_tree: the privacy accountant (dp_accounting): rdp (epsilon every'
    ' round; any sampling) or pld (tighter; Poisson sampling; epsilon at evaluations).',
    choices=accounting.ACCOUNTANTS,
  )

  def __post_init__(self):
    settings.check(self)
    given = [n for n in ('clip_norm', *_NOISE_FLAGS) if getattr(self, n) is not None]
    if self.aggregator not in privacy.KINDS and given:
      raise ValueError(
        f'--{given[0]} sets a clipping or DP aggregator: add --aggregator=clip, dp or dp_adaptive.'
      )
    if self.aggregator == privacy.CLIP and set(given) & set(_NOISE_FLAGS):
      raise ValueError(
        '--aggregator=clip adds no noise: --noise_multiplier,'
        ' --target_epsilon and --target_delta go with --aggregator=dp or'
        ' dp_adaptive.'
      )
    # Settings another aggregator would ignore: said, not dropped.
    changed = [f.name for f in dataclasses.fields(self) if getattr(self, f.name) != f.default]
    adaptive = [n for n in changed if n in _ADAPTIVE_FLAGS]
    if adaptive and self.aggregator != privacy.DP_ADAPTIVE:
      raise ValueError(
        f'--{adaptive[0]} sets the adapting clip of --aggregator=dp_adaptive'
        f" (this run's is {self.aggregator})."
      )
    if 'accountant' in changed and not self.private:
      raise ValueError(
        '--accountant counts the privacy of --aggregator=dp or dp_adaptive'
        f" (this run's is {self.aggregator})."
      )
    if self.clip_norm is None and self.aggregator in (privacy.CLIP, *privacy.COHORT_SCALED):
      raise ValueError(
        f'--aggregator={self.aggregator} needs --clip_norm (the L2 norm'
        " each client's update is clipped to)."
      )
    if self.private and self.noise_multiplier is None and self.target_epsilon is None:
      raise ValueError(
        f'--aggregator={self.aggregator} needs --noise_multiplier or --target_epsilon.'
      )

  @property
  def private(self) -> bool:
    """Adds noise (dp, dp_adaptive, dp_ftrl_tree, dp_bandmf)."""
    return self.aggregator in privacy.KINDS and self.aggregator != privacy.CLIP

  def plan(
    self,
    *,
    clients_per_round: int,
    population: int,
    rounds: int,
    sampling: str,
    min_separation: int = 0,
    recorded: dict[str, Any] | None = None,
  ) -> Plan:
    """The aggregator for a run of `rounds` rounds of `clients_per_round` clients drawn
    by `sampling` from `population`; a resumed DP run keeps the noise multiplier it
    `recorded` (calibrating again for a changed --rounds would change the noise
    mid-run), and a BandMF run its strategy's rounds. `min_separation` > 1: uniform
    draws each client at most once in that many rounds (accounted as 'separated').
    Raises ValueError ('--aggregator=...: why')."""
    if self.aggregator not in privacy.KINDS:
      return Plan(None, None, {})
    if min_separation > 1:
      sampling = 'separated'
    recorded = recorded or {}
    ledger, z, resolved, strategy = None, 0.0, {}, None
    n, restart, bands, epoch = clients_per_round, 0, 0, 0
    # The accounting's clients a round: the noise's cohort.
    accounted = self.noise_cohort_size or n
    try:
      if self.noise_cohort_size and self.noise_cohort_size > population:
        raise ValueError(
          f'--noise_cohort_size={accounted} is over the population ({population}): the'
          ' accounting samples that many of it.'
        )
      # A client's rounds are this far apart: the separation, or a cyclic epoch of the
      # accounted cohort's (N // M: the accounting's clients, each in one round of it).
      if self.aggregator in (privacy.DP_FTRL_TREE, privacy.DP_BANDMF):
        epoch = (
          min_separation
          if sampling == 'separated'
          else sampling_lib.epoch_rounds(population, accounted)
        )
      if self.aggregator == privacy.DP_FTRL_TREE:
        restart = self.restart_every or epoch
        if restart > epoch and sampling in accounting.BOUNDED:
          apart = (
            f'the --min_separation of {epoch} rounds'
            if sampling == 'separated'
            else f'the {epoch} rounds of a cyclic epoch ({population} clients, {accounted} a round)'
          )
          raise ValueError(
            f'--restart_every={restart} is over {apart}: a client would be in two rounds of a tree.'
          )
      if self.aggregator == privacy.DP_BANDMF:
        strategy_rounds = recorded.get('strategy_rounds', rounds)
        if rounds > strategy_rounds:
          raise ValueError(
            f'its strategy covers the {strategy_rounds} rounds the run began with; it'
            f' cannot be extended to {rounds}.'
          )
        bands = self.bands or min(epoch, strategy_rounds, DEFAULT_MAX_BANDS)
        if bands > strategy_rounds:
          raise ValueError(f"--bands={bands} is over the run's {strategy_rounds} rounds.")
        resolved.update(bands=bands, strategy_rounds=strategy_rounds)
      if self.private:
        delta = (
          self.target_delta
          if self.target_delta is not None
          else accounting.default_delta(population)
        )
        accounting.check(
          sampling, self.accountant, delta, population, restart, bands=bands, epoch=epoch
        )
        if bands:  # optimized (or read from the cache) once the run is known to apply
          strategy = strategy_cache.strategy(resolved['strategy_rounds'], bands)
        z = self.noise_multiplier
        if z is None:
          z = recorded.get('noise_multiplier')
        if z is None:
          z = accounting.calibrate(
            self.target_epsilon,
            rounds,
            clients_per_round=accounted,
            population=population,
            sampling=sampling,
            delta=delta,
            accountant=self.accountant,
            restart_every=restart,
            bands=bands,
            epoch=epoch,
          )
        ledger = accounting.Ledger(
          z, accounted, population, sampling, delta, self.accountant, restart, bands, epoch
        )
        if self.target_epsilon is not None and ledger.epsilon(1) > self.target_epsilon:
          raise ValueError(
            f'one round with noise multiplier {z:.4g} already spends'
            f' epsilon {ledger.epsilon(1):.3g}, over --target_epsilon.'
          )
        resolved.update(noise_multiplier=z, target_delta=delta)
        if restart:
          resolved['restart_every'] = restart
      clip_norm = self.clip_norm if self.clip_norm is not None else DEFAULT_ADAPTIVE_CLIP
      mean = privacy.PrivateMean(
        self.aggregator,
        clip_norm,
        z,
        n,
        self.clip_quantile,
        self.clip_learning_rate,
        self.clipped_count_stddev,
        restart,
        self.noise_cohort_size,
        strategy,
      )
    except ValueError as e:
      raise ValueError(f'--aggregator={self.aggregator}: {e}') from e
    return Plan(mean, ledger, resolved)

  def callbacks(
    self, ledger: accounting.Ledger | None, rounds: int, eval_period: int, show_progress: bool
  ) -> tuple[callbacks.Callback, ...]:
    """A DP run's accounting: epsilon every round (pld: at evaluations), and an end when
    --target_epsilon is spent (with a fixed --noise_multiplier, or a resumed run given
    more rounds)."""
    if ledger is None:
      return ()
    budget = self.target_epsilon
    last = rounds if budget is None else ledger.rounds_within(budget, rounds)
    if show_progress:
      line = privacy_line(ledger, budget, last)
      if self.noise_cohort_size:
        line += f'; noise of a cohort of {self.noise_cohort_size} (--noise_cohort_size)'
      print(line, flush=True)
    return (
      accounting.PrivacySpent(
        ledger, last, budget, every=1 if ledger.accountant == 'rdp' else eval_period
      ),
    )


def privacy_line(ledger: accounting.Ledger, budget: float | None, last: int) -> str:
  """A DP run's `privacy:` line: the noise, what the accounting assumes (the delta
  accounted with among it, under 1/population: `accounting.check`), and how long the
  epsilon budget lasts (a tree restarting after the run's `last` rounds: said so)."""
  line = f'privacy: noise multiplier {ledger.noise_multiplier:.4g}; {ledger.assumption}'
  if ledger.restart_every and ledger.restart_every >= last:
    line += f' (no restart within these {last} rounds: one tree)'
  return line + (f'; epsilon {budget} lasts {last} rounds' if budget else '')


def configure(
  options: PrivacyOptions,
  aggregation: aggregation_settings.AggregationOptions,
  algorithm: Any,
  builder_args: dict[str, Any],
  *,
  rounds: int,
  clients_per_round: int,
  client_weighting: str | None,
  population: int,
  sampling: str,
  resuming: str | None,
  min_separation: int = 0,
) -> Plan:
  """Puts the run's model aggregator into the builder's arguments `builder_args` of the
  registered `algorithm`: --aggregator's `ops.privacy.PrivateMean` (clip, dp,
  dp_adaptive), or with a robust combiner, compression, secure aggregation or attackers
  the chain of all of them (`aggregation_settings.AggregationOptions.chain`); an
  aggregator counting every client alike (DP, the robust ones) weighs them uniformly.
  Returns the plan, its `resolved` the run settings it fixes (the noise multiplier and
  delta; 'uniform' client weighting where it forces it). `resuming`: the output
  directory of a run being resumed, whose recorded noise multiplier is kept.

  Raises:
    ConfigError: a setting that cannot apply.
  """
  robust = options.aggregator in registry.COMBINERS.names()
  if options.aggregator == MEAN and not aggregation.active:
    return Plan(None, None, {})
  if not algorithm.accepts('model_aggregator'):
    raise settings.ConfigError(
      f'--aggregator and --compression, --secure_aggregation, --attack: algorithm'
      f' {algorithm.name!r} takes no model aggregator (its aggregation is its own math).'
    )
  kept = [
    flag
    for flag, on in (
      ('--error_feedback', aggregation.error_feedback != 'none'),
      ('--worker_momentum', aggregation.worker_momentum > 0),
    )
    if on
  ]
  if sampling == 'with_replacement' and kept:
    raise settings.ConfigError(
      f'{kept[0]} keeps a row per client, which a client drawn twice a round would'
      ' overwrite; use uniform or poisson sampling.'
    )
  try:
    plan = options.plan(
      clients_per_round=clients_per_round,
      population=population,
      rounds=rounds,
      sampling=sampling,
      min_separation=min_separation,
      recorded=None if resuming is None else recorded_settings(resuming),
    )
    model_aggregator = plan.mean
    if robust or aggregation.active:
      model_aggregator = aggregation.chain(
        options.aggregator, None if plan.mean is None else plan.mean.chain(), clients_per_round
      )
  except ValueError as e:
    raise settings.ConfigError(str(e)) from e
  chain = (
    model_aggregator
    if isinstance(model_aggregator, aggregators.Chain)
    else model_aggregator.chain()
  )
  forced = {}
  if options.private or not chain.weighted:
    if client_weighting not in (None, 'uniform'):
      named = (
        '--compression=sign (a majority vote)'
        if isinstance(chain.combiner, aggregators.MajorityVote)
        else f'--aggregator={options.aggregator}'
      )
      why = "TFF's DP semantics" if options.private else 'a robust combiner'
      raise settings.ConfigError(
        f'{named} weighs every client alike ({why}): drop --client_weighting or set it to uniform.'
      )
    if algorithm.accepts('client_weighting'):
      builder_args['client_weighting'] = forced['client_weighting'] = 'uniform'
  builder_args['model_aggregator'] = model_aggregator
  return dataclasses.replace(plan, resolved={**forced, **plan.resolved})


def recorded_settings(output_dir: str | pathlib.Path) -> dict[str, Any]:
  """What a DP run in `output_dir` recorded and a resume keeps: its noise multiplier and
  its BandMF strategy's rounds (those readable)."""
  try:
    resolved = json.loads((pathlib.Path(output_dir) / 'config.json').read_text())['resolved']
  except (OSError, ValueError, KeyError, TypeError):
    return {}
  kept = {}
  for key, kind in (('noise_multiplier', float), ('strategy_rounds', int)):
    try:
      kept[key] = kind(resolved[key])
    except (KeyError, TypeError, ValueError):
      pass
  return kept
