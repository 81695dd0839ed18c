"""Clipping and differential privacy of the model delta: the settings of the mechanism
`--aggregator` chooses (an `ops.privacy.PrivateMean`, `registry.MECHANISMS`; the flag
itself is the aggregation's, `aggregation_settings`), and the privacy it spends.

`PrivacyOptions` is the record of these settings; `PrivacyOptions.plan` resolves them
for a run (the clip, the noise multiplier given or calibrated to a target epsilon, the
delta) into the mechanism every runtime runs and the `accounting.Ledger` that counts
epsilon; `configure` puts the run's aggregator into an algorithm's arguments. The math
is in `ops.privacy`, the accounting in `accounting`. What a mechanism is (private,
adaptive, correlated across rounds, scaled to a noise cohort) is read off its class,
never its name.
"""

import dataclasses
import json
import pathlib
import typing
from typing import Any

from tff_comp import accounting, registry, settings, strategy_cache
from tff_comp.config import aggregation_settings
from tff_comp.ops import aggregators, matrix_factorization, privacy
from tff_comp.run import callbacks
from tff_comp.run import sampling as sampling_lib


def mechanism(aggregator: str) -> type[privacy.PrivateMean] | None:
  """The mechanism class `--aggregator=aggregator` names (None: not clipping or DP)."""
  if aggregator not in registry.MECHANISMS.names():
    return None
  # A mechanism registers its class as its builder (`registry.register_mechanism`).
  return typing.cast(type[privacy.PrivateMean], registry.MECHANISMS.get(aggregator).builder)


def _mechanisms(having: str) -> tuple[str, ...]:
  """The names of the mechanisms with the class attribute or field `having` true/set."""
  return tuple(
    name
    for name in registry.MECHANISMS.names()
    if (chosen := mechanism(name)) is not None
    and (getattr(chosen, having, False) or having in {f.name for f in dataclasses.fields(chosen)})
  )


_NOISE_FLAGS = ('noise_multiplier', 'target_epsilon', 'target_delta')
_ADAPTIVE_FLAGS = ('clip_quantile', 'clip_learning_rate', 'clipped_count_stddev')
DEFAULT_ADAPTIVE_CLIP = 0.1  # TFF's initial_l2_norm_clip
# dp_bandmf's default bands at most: the noise keeps b - 1 model-sized vectors.
DEFAULT_MAX_BANDS = 32


@dataclasses.dataclass(frozen=True)
class Plan:
  """A run's aggregator as resolved: `mean` (None for the algorithm's own), the ledger
  of a DP run, the values config.json records (`noise_multiplier`, `target_delta`), and
  the builder's arguments the aggregation sets (`configure`: `model_aggregator`, and
  `client_weighting` where it forces it)."""

  mean: privacy.PrivateMean | None
  ledger: accounting.Ledger | None
  resolved: dict[str, Any]
  arguments: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class PrivacyOptions:
  """Clipping and differential privacy of the model delta (side channels stay exact)."""

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
    applies_when={'aggregator': _mechanisms('restart_every')},
  )
  bands: int = settings.setting(
    0,
    "dp_bandmf: the factorization's bands b, each client's rounds at least b apart (0:"
    f' a cyclic epoch, population // clients_per_round rounds, at most {DEFAULT_MAX_BANDS}'
    ' and --rounds); the noise keeps b - 1 model-sized vectors.',
    lower=0,
    upper=matrix_factorization.MAX_ROUNDS,
    applies_when={'aggregator': _mechanisms('strategy')},
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
    applies_when={'aggregator': _mechanisms('cohort_scaled')},
  )
  noise_population: int | None = settings.setting(
    None,
    'dp, dp_ftrl_tree, dp_bandmf: the population P the accounting draws its cohorts from'
    " (pfl-research's population): with --noise_cohort_size M, the privacy of M clients a"
    ' round out of P (Poisson q = M / P; a cyclic epoch of P // M rounds; delta P^-1.1 by'
    " default), a production population's, while the run trains on the task's clients"
    " (default: the task's clients; not fewer).",
    lower=1,
    upper=settings.MAX_COUNT,
    applies_when={'aggregator': _mechanisms('cohort_scaled')},
  )
  accountant: str = settings.setting(
    'rdp',
    'dp, dp_adaptive, dp_ftrl_tree: the privacy accountant (dp_accounting): rdp (epsilon every'
    ' round; any sampling) or pld (tighter; Poisson sampling; epsilon at evaluations).',
    choices=accounting.ACCOUNTANTS,
  )

  def __post_init__(self):
    settings.check(self)

  def check(self, aggregator: str) -> None:
    """Raises ValueError (one line) for a setting `--aggregator=aggregator` would not use
    or one it lacks."""
    chosen = mechanism(aggregator)
    given = [n for n in ('clip_norm', *_NOISE_FLAGS) if getattr(self, n) is not None]
    if chosen is None and given:
      raise ValueError(
        f'--{given[0]} sets a clipping or DP aggregator: add --aggregator='
        + ', '.join(registry.MECHANISMS.names())
        + '.'
      )
    private = chosen is not None and chosen.private
    if chosen is not None and not private and set(given) & set(_NOISE_FLAGS):
      raise ValueError(
        f'--aggregator={aggregator} adds no noise: --noise_multiplier,'
        ' --target_epsilon and --target_delta go with a DP --aggregator'
        f' ({", ".join(_mechanisms("private"))}).'
      )
    # Settings another aggregator would ignore: said, not dropped.
    changed = [f.name for f in dataclasses.fields(self) if getattr(self, f.name) != f.default]
    adaptive = [n for n in changed if n in _ADAPTIVE_FLAGS]
    if adaptive and not (chosen is not None and chosen.adaptive):
      raise ValueError(
        f'--{adaptive[0]} sets the adapting clip of --aggregator='
        f"{', '.join(_mechanisms('adaptive'))} (this run's is {aggregator})."
      )
    if 'accountant' in changed and not private:
      raise ValueError(
        f"--accountant counts the privacy of a DP --aggregator (this run's is {aggregator})."
      )
    if chosen is not None and self.clip_norm is None and not chosen.adaptive:
      raise ValueError(
        f"--aggregator={aggregator} needs --clip_norm (the L2 norm each client's update is"
        ' clipped to).'
      )
    if private and self.noise_multiplier is None and self.target_epsilon is None:
      raise ValueError(f'--aggregator={aggregator} needs --noise_multiplier or --target_epsilon.')

  def plan(
    self,
    aggregator: str,
    *,
    clients_per_round: int,
    population: int,
    rounds: int,
    sampling: str,
    min_separation: int = 0,
    recorded: dict[str, Any] | None = None,
  ) -> Plan:
    """The mechanism `--aggregator=aggregator` names (None for any other), for a run of
    `rounds` rounds of `clients_per_round` clients drawn by `sampling` from
    `population`; a resumed DP run keeps the noise multiplier it
    `recorded` (calibrating again for a changed --rounds would change the noise
    mid-run), and a BandMF run its strategy's rounds. `min_separation` > 1: uniform
    draws each client at most once in that many rounds (accounted as 'separated').
    Raises ValueError ('--aggregator=...: why')."""
    chosen = mechanism(aggregator)
    if chosen is None:
      return Plan(None, None, {})
    fields = {f.name for f in dataclasses.fields(chosen)}
    if min_separation > 1:
      sampling = 'separated'
    recorded = recorded or {}
    ledger, z, strategy = None, 0.0, None
    resolved: dict[str, Any] = {}
    n, restart, bands, epoch = clients_per_round, 0, 0, 0
    # The accounting's clients a round: the noise's cohort; its population.
    accounted = self.noise_cohort_size or n
    try:
      if self.noise_population is not None:
        if self.noise_population < population:
          raise ValueError(
            f'--noise_population={self.noise_population} is under the {population} clients'
            ' the run trains on.'
          )
        population = self.noise_population
      if self.noise_cohort_size and self.noise_cohort_size > population:
        raise ValueError(
          f'--noise_cohort_size={accounted} is over the population ({population}): the'
          ' accounting samples that many of it.'
        )
      # A client's rounds are this far apart: the separation, or a cyclic epoch of the
      # accounted cohort's (N // M: the accounting's clients, each in one round of it).
      if chosen.correlated:
        epoch = (
          min_separation
          if sampling == 'separated'
          else sampling_lib.epoch_rounds(population, accounted)
        )
      if 'restart_every' in fields:
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
      if 'strategy' in fields:
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
      if chosen.private:
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
        noise = self.noise_multiplier
        if noise is None:
          noise = recorded.get('noise_multiplier')
        if noise is None:
          assert self.target_epsilon is not None  # one of the two (`check`)
          noise = accounting.calibrate(
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
        z = noise
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
      available: dict[str, Any] = dict(
        clip_norm=clip_norm,
        noise_multiplier=z,
        clients_per_round=n,
        noise_cohort_size=self.noise_cohort_size,
        target_quantile=self.clip_quantile,
        clip_learning_rate=self.clip_learning_rate,
        clipped_count_stddev=self.clipped_count_stddev,
        restart_every=restart,
        strategy=strategy,
      )
      mean = chosen(**{name: value for name, value in available.items() if name in fields})
    except ValueError as e:
      raise ValueError(f'--aggregator={aggregator}: {e}') from e
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
      if self.noise_population:
        line += f' of a population of {self.noise_population} (--noise_population)'
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
  *,
  rounds: int,
  clients_per_round: int,
  client_weighting: str | None,
  population: int,
  sampling: str,
  resuming: str | None,
  min_separation: int = 0,
) -> Plan:
  """The run's model aggregator, for the builder of the registered `algorithm` (the
  plan's `arguments`): --aggregator's `ops.privacy.PrivateMean` (clip, dp,
  dp_adaptive), or with a robust combiner, compression, secure aggregation or attackers
  the chain of all of them (`aggregation_settings.AggregationOptions.chain`); an
  aggregator counting every client alike (DP, the robust ones) weighs them uniformly.
  Returns the plan, its `resolved` the run settings it fixes (the noise multiplier and
  delta; 'uniform' client weighting where it forces it). `resuming`: the output
  directory of a run being resumed, whose recorded noise multiplier is kept.

  Raises:
    ConfigError: a setting that cannot apply.
  """
  aggregator = aggregation.aggregator
  robust = aggregator in registry.COMBINERS.names()
  if aggregator == aggregation_settings.MEAN and not aggregation.active:
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
      aggregator,
      clients_per_round=clients_per_round,
      population=population,
      rounds=rounds,
      sampling=sampling,
      min_separation=min_separation,
      recorded=None if resuming is None else recorded_settings(resuming),
    )
    model_aggregator: privacy.PrivateMean | aggregators.Chain | None = plan.mean
    if robust or aggregation.active:
      model_aggregator = aggregation.chain(
        None if plan.mean is None else plan.mean.chain(), clients_per_round
      )
  except ValueError as e:
    raise settings.ConfigError(str(e)) from e
  assert model_aggregator is not None  # a mechanism or a chain: the mean alone returned above
  chain = (
    model_aggregator
    if isinstance(model_aggregator, aggregators.Chain)
    else model_aggregator.chain()
  )
  forced = {}
  private = plan.mean is not None and plan.mean.private
  if private or not chain.weighted:
    if client_weighting not in (None, 'uniform'):
      named = (
        '--compression=sign (a majority vote)'
        if isinstance(chain.combiner, aggregators.MajorityVote)
        else f'--aggregator={aggregator}'
      )
      why = "TFF's DP semantics" if private else 'a robust combiner'
      raise settings.ConfigError(
        f'{named} weighs every client alike ({why}): drop --client_weighting or set it to uniform.'
      )
    if algorithm.accepts('client_weighting'):
      forced['client_weighting'] = 'uniform'
  return dataclasses.replace(
    plan,
    resolved={**forced, **plan.resolved},
    arguments={**forced, 'model_aggregator': model_aggregator},
  )


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
