"""Which clients a round trains: sampling (uniform, with replacement, Poisson) and
availability (dropouts, stragglers, and with a device model deadlines, over-selection
and availability windows: `run.devices`), drawn from the run's seed and the round
alone."""

from collections.abc import Sequence
import dataclasses
import math
from typing import NamedTuple

import numpy as np

from tff_comp import settings
from tff_comp.run import devices as devices_lib
from tff_comp.run import outputs

SAMPLINGS = ('uniform', 'with_replacement', 'poisson', 'cyclic')
# Salt of the cyclic order's draw, apart from the rounds' draws (seed, round >= 1).
_CYCLIC_ORDER = 0xC7C1


@dataclasses.dataclass(frozen=True)
class Participation:
  """How a round's clients are drawn and which of them finish their work.

  sampling: 'uniform' (k distinct clients), 'with_replacement' (k draws; a client drawn
    twice trains twice), 'poisson' (each client independently with probability
    k / population: cohorts of varying size, as DP-FedAvg's accounting assumes) or
    'cyclic' (the population in one order drawn from the seed, cut into E = floor(N / k)
    blocks of k, round r taking block (r - 1) mod E: each client once an epoch of E
    rounds, the N mod k left over never; the participation DP-FTRL's and banded matrix
    factorization's accounting assume, Kairouz et al. 2021, Choquette-Choo et al. 2023).
  dropout_rate: the chance that a sampled client fails to report; its update is lost
    and the round aggregates the others' (none: the model is unchanged).
  straggler_rate: the chance that a reporting client is a straggler, completing only
    `straggler_work` of its local steps (at least one; FedNova's a_i counts the steps
    done).
  """

  sampling: str = settings.setting(
    'uniform',
    "How each round's clients are drawn: uniform (--clients_per_round"
    ' distinct clients), with_replacement, poisson (each client with probability'
    ' clients_per_round / population; cohorts vary in size) or cyclic (blocks of'
    ' --clients_per_round in one order drawn from the seed, each client once an epoch of'
    ' population // clients_per_round rounds; as --aggregator=dp_ftrl_tree assumes).',
    choices=SAMPLINGS,
    per_trial=True,
  )
  dropout_rate: float = settings.setting(
    0.0,
    'Chance that a sampled client fails to report (its update is lost; a round'
    ' nobody reports leaves the model as it was).',
    lower=0.0,
    per_trial=True,
  )
  straggler_rate: float = settings.setting(
    0.0,
    'Chance that a reporting client straggles, doing only --straggler_work of its'
    ' local steps (in-process runtime).',
    lower=0.0,
    per_trial=True,
  )
  straggler_work: float = settings.setting(
    0.5,
    'The share of its local steps a straggler completes (at least one step).',
    above=0.0,
    upper=1.0,
    per_trial=True,
  )
  min_separation: int = settings.setting(
    0,
    'With --sampling=uniform: each client in at most one of any --min_separation'
    ' consecutive rounds (a round draws among the clients the previous'
    ' min_separation - 1 rounds did not sample; 0 or 1: no bound). The participation'
    ' --aggregator=dp_bandmf (--bands at most it) and dp_ftrl_tree (--restart_every at'
    ' most it) account without a fixed order.',
    lower=0,
    upper=settings.MAX_COUNT,
  )

  def __post_init__(self):
    settings.check(self)
    for name in ('dropout_rate', 'straggler_rate'):
      if not getattr(self, name) < 1.0:
        raise ValueError(f'--{name} must be in [0, 1), got {getattr(self, name)}.')
    if self.min_separation > 1 and self.sampling != 'uniform':
      raise ValueError(
        f'--min_separation bounds uniform sampling (this run samples {self.sampling}).'
      )

  @property
  def separated(self) -> bool:
    """Rounds drawn at least `min_separation` (> 1) apart for each client."""
    return self.min_separation > 1


def check_population(participation: Participation, clients_per_round: int, population: int):
  """ValueError (one line) if `participation` cannot draw `clients_per_round` clients a
  round from `population`."""
  needed = clients_per_round * participation.min_separation
  if participation.separated and population < needed:
    raise ValueError(
      f'--min_separation={participation.min_separation} with {clients_per_round} clients a'
      f' round needs at least {needed} clients (the population has {population}).'
    )


class RoundClients(NamedTuple):
  """A round's clients: those sampled, those reporting (in order; a runtime trains
  these) and each reporting client's share of its local steps (None: all of them).
  With a device model: how many reported too late (or were over-selected away), the
  round's simulated seconds and the simulated clock at its end. `steps`: the round runs
  even when no client reports (a buffered async step aggregates clients that started
  earlier)."""

  sampled: tuple[str, ...]
  reporting: tuple[str, ...]
  work: tuple[float, ...] | None
  late: int = 0
  seconds: float | None = None
  clock: float | None = None
  steps: bool = False

  def metrics(self) -> outputs.Metrics:
    """participation/sampled, /reporting, /straggling: clients counted per round; with
    a device model participation/late, time/round_seconds and time/simulated_seconds
    (the clock at the round's end)."""
    metrics = {
      'participation/sampled': float(len(self.sampled)),
      'participation/reporting': float(len(self.reporting)),
      'participation/straggling': float(sum(w < 1 for w in self.work or ())),
    }
    if self.seconds is not None and self.clock is not None:  # set together, by a device model
      metrics.update(
        {
          'participation/late': float(self.late),
          'time/round_seconds': self.seconds,
          'time/simulated_seconds': self.clock,
        }
      )
    return metrics


# Rounds `ClientSampler.sample` draws at once.
AHEAD = 32


class ClientSampler:
  """The loop's sampling hook: `sample(round_num)` draws round `round_num`'s clients
  (`Participation` says how) from a NumPy generator seeded by (seed, round), so any
  round's draw is the same in every run with `seed`, resumed or not.

  With a `clock` (`devices.DeviceClock`), a round samples among the clients available
  at the simulated time it starts (replayed from round 1, cached), ceil(overselect x
  clients_per_round) of them, and keeps those the deadline and over-selection keep.

  A replacement is any object with `sample(round_num) -> RoundClients` and a
  `capacity` (the most reporting clients a round may have, a hint for runtimes that
  compile per cohort size).
  """

  def __init__(
    self,
    client_ids: Sequence[str],
    clients_per_round: int,
    seed: int,
    participation: Participation = Participation(),
    clock: devices_lib.DeviceClock | None = None,
  ):
    self._ids, self._k, self._seed = list(client_ids), clients_per_round, seed
    self.participation, self._clock = participation, clock
    if clock is not None and participation.sampling == 'cyclic':
      raise ValueError(
        '--sampling=cyclic takes fixed blocks of clients in turn, which a device model'
        " choosing the clients available at a round's time would break."
      )
    if clock is not None and participation.separated:
      raise ValueError(
        '--min_separation draws among the clients recent rounds did not sample, which a'
        " device model choosing the clients available at a round's time would break."
      )
    check_population(participation, clients_per_round, len(self._ids))
    self._history: dict[int, np.ndarray] = {}  # rounds' sampled positions (separated)
    self._drawn = (
      clients_per_round
      if clock is None
      else min(len(self._ids), math.ceil(clock.options.overselect * clients_per_round))
    )
    self.capacity = _capacity(self._drawn, len(self._ids), participation.sampling)
    if clock is not None and clock.options.overselect > 1:
      self.capacity = min(self.capacity, clients_per_round)
    self._clocks = [0.0]  # the simulated clock at the end of rounds 0, 1, ...
    self._ahead: dict[int, RoundClients] = {}  # rounds drawn ahead (`sample`)

  def sample(self, round_num: int) -> RoundClients:
    """Round `round_num`'s clients. Without a clock the rounds are drawn `AHEAD` at a
    time: a draw alone, between rounds whose kernels had evicted NumPy's code and data
    from the caches, took several times the CPU of draws in a row. Each round's
    draw depends on (seed, round) alone, so they are the same."""
    if self._clock is None:
      if round_num not in self._ahead:
        self._ahead = {r: self._draw(r, self._ids) for r in range(round_num, round_num + AHEAD)}
      return self._ahead[round_num]
    while len(self._clocks) < round_num:  # the clock at this round's start, replayed
      self._timed(len(self._clocks))
    return self._timed(round_num)

  def _draw(self, round_num: int, ids: Sequence[str]) -> RoundClients:
    rng = np.random.default_rng([self._seed, round_num])
    p, n = self.participation, len(ids)
    # Availability may leave fewer clients than a round draws.
    k = self._drawn if self._clock is None else min(self._drawn, n)
    if p.sampling == 'poisson':
      chosen = np.flatnonzero(rng.random(n) < min(1.0, self._drawn / max(n, 1)))
    elif p.sampling == 'cyclic':
      order = np.random.default_rng([self._seed, _CYCLIC_ORDER]).permutation(n)
      block = (round_num - 1) % epoch_rounds(n, k)
      chosen = order[block * k : (block + 1) * k]
    elif p.separated:
      recent = [
        self._separated(r) for r in range(max(1, round_num - p.min_separation + 1), round_num)
      ]
      allowed = np.setdiff1d(np.arange(n), np.concatenate([np.zeros(0, int), *recent]))
      chosen = allowed[rng.choice(len(allowed), k, replace=False)]
      self._history[round_num] = chosen
    else:
      chosen = rng.choice(n, k, replace=p.sampling == 'with_replacement')
    sampled = tuple(ids[i] for i in chosen)
    reporting = tuple(
      c for c, u in zip(sampled, rng.random(len(sampled)), strict=True) if u >= p.dropout_rate
    )
    straggling = rng.random(len(reporting)) < p.straggler_rate
    work = tuple(p.straggler_work if s else 1.0 for s in straggling) if straggling.any() else None
    return RoundClients(sampled, reporting, work)

  def _separated(self, round_num: int) -> np.ndarray:
    """The positions round `round_num` sampled under --min_separation, drawing the
    rounds before it first (from the earliest not drawn: each depends on the last
    min_separation - 1)."""
    first = round_num
    while first > 1 and first - 1 not in self._history:
      first -= 1
    for r in range(first, round_num + 1):
      if r not in self._history:
        self._draw(r, self._ids)
    return self._history[round_num]

  def _timed(self, round_num: int) -> RoundClients:
    """Round `round_num` on the devices, from the clock at its start."""
    clock = self._clock
    assert clock is not None  # a sampler with a device model
    start = self._clocks[round_num - 1]
    available = clock.available(self._ids, start)
    if not available:
      seconds = clock.next_window(start) - start
      clients = RoundClients((), (), None, 0, seconds, start + seconds)
    else:
      drawn = self._draw(round_num, available)
      keep = self._k if clock.options.overselect > 1 else None
      timing = clock.time_round(drawn.reporting, keep)
      seconds = timing.seconds
      clients = RoundClients(
        drawn.sampled, timing.kept, timing.work, timing.late, seconds, start + seconds
      )
    if len(self._clocks) == round_num:
      self._clocks.append(start + seconds)
    return clients


def epoch_rounds(population: int, clients_per_round: int) -> int:
  """E: the rounds of a cyclic epoch, each taking a block of `clients_per_round`."""
  return max(1, population // max(1, clients_per_round))


def _capacity(k: int, n: int, sampling: str) -> int:
  """The most clients a round of `k` expected draws from `n` may report."""
  if sampling != 'poisson':
    return k
  # The cohort is Binomial(n, q): five standard deviations above its mean.
  q = min(1.0, k / n)
  return min(n, math.ceil(k + 5 * math.sqrt(k * (1 - q)) + 1))


def timed_sampler(
  client_data,
  clients_per_round: int,
  seed: int,
  participation: Participation,
  options: devices_lib.DeviceOptions,
  algorithm,
) -> ClientSampler | None:
  """The run's sampler on its devices' clock (`devices.clock_for`; None without a
  device model: the loop's own sampler)."""
  clock = devices_lib.clock_for(options, client_data, algorithm, seed)
  if clock is None:
    return None
  return ClientSampler(client_data.client_ids, clients_per_round, seed, participation, clock)
