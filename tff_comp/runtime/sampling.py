"""Which clients a round trains: sampling (uniform, with replacement, Poisson) and
availability (dropouts, stragglers), drawn from the run's seed and the round alone."""

from collections.abc import Sequence
import dataclasses
import math
from typing import NamedTuple

import numpy as np

from tff_comp import settings
from tff_comp.runtime import run_files


SAMPLINGS = ('uniform', 'with_replacement', 'poisson')


@dataclasses.dataclass(frozen=True)
class Participation:
  """How a round's clients are drawn and which of them finish their work.

  sampling: 'uniform' (k distinct clients), 'with_replacement' (k draws; a client drawn
    twice trains twice) or 'poisson' (each client independently with probability
    k / population: cohorts of varying size, as DP accounting assumes).
  dropout_rate: the chance that a sampled client fails to report; its update is lost
    and the round aggregates the others' (none: the model is unchanged).
  straggler_rate: the chance that a reporting client is a straggler, completing only
    `straggler_work` of its local steps (at least one; FedNova's a_i counts the steps
    done).
  """

  sampling: str = settings.setting(
      'uniform', 'How each round\'s clients are drawn: uniform (--clients_per_round'
      ' distinct clients), with_replacement, or poisson (each client with probability'
      ' clients_per_round / population; cohorts vary in size).', choices=SAMPLINGS)
  dropout_rate: float = settings.setting(
      0.0, 'Chance that a sampled client fails to report (its update is lost; a round'
      ' nobody reports leaves the model as it was).', lower=0.0)
  straggler_rate: float = settings.setting(
      0.0, 'Chance that a reporting client straggles, doing only --straggler_work of its'
      ' local steps (in-process runtime).', lower=0.0)
  straggler_work: float = settings.setting(
      0.5, 'The share of its local steps a straggler completes (at least one step).',
      above=0.0, upper=1.0)

  def __post_init__(self):
    settings.check(self)
    for name in ('dropout_rate', 'straggler_rate'):
      if not getattr(self, name) < 1.0:
        raise ValueError(f'--{name} must be in [0, 1), got {getattr(self, name)}.')


class RoundClients(NamedTuple):
  """A round's clients: those sampled, those reporting (in order; a runtime trains
  these) and each reporting client's share of its local steps (None: all of them)."""

  sampled: tuple[str, ...]
  reporting: tuple[str, ...]
  work: tuple[float, ...] | None

  def metrics(self) -> run_files.Metrics:
    """participation/sampled, /reporting, /straggling: clients counted per round."""
    return {'participation/sampled': float(len(self.sampled)),
            'participation/reporting': float(len(self.reporting)),
            'participation/straggling': float(sum(w < 1 for w in self.work or ()))}


class ClientSampler:
  """The loop's sampling hook: `sample(round_num)` draws round `round_num`'s clients
  (`Participation` says how) from a NumPy generator seeded by (seed, round), so any
  round's draw is the same in every run with `seed`, resumed or not.

  A replacement is any object with `sample(round_num) -> RoundClients` and a
  `capacity` (the most reporting clients a round may have, a hint for runtimes that
  compile per cohort size).
  """

  def __init__(self, client_ids: Sequence[str], clients_per_round: int, seed: int,
               participation: Participation = Participation()):
    self._ids, self._k, self._seed = list(client_ids), clients_per_round, seed
    self.participation = participation
    n = len(self._ids)
    if participation.sampling == 'poisson':
      # The cohort is Binomial(n, q): five standard deviations above its mean.
      q = min(1.0, clients_per_round / n)
      self.capacity = min(n, math.ceil(clients_per_round + 5 * math.sqrt(
          clients_per_round * (1 - q)) + 1))
    else:
      self.capacity = clients_per_round

  def sample(self, round_num: int) -> RoundClients:
    rng = np.random.default_rng([self._seed, round_num])
    p, n = self.participation, len(self._ids)
    if p.sampling == 'poisson':
      chosen = np.flatnonzero(rng.random(n) < min(1.0, self._k / n))
    else:
      chosen = rng.choice(n, self._k, replace=p.sampling == 'with_replacement')
    sampled = tuple(self._ids[i] for i in chosen)
    reporting = tuple(c for c, u in zip(sampled, rng.random(len(sampled)), strict=True)
                      if u >= p.dropout_rate)
    straggling = rng.random(len(reporting)) < p.straggler_rate
    work = (tuple(p.straggler_work if s else 1.0 for s in straggling)
            if straggling.any() else None)
    return RoundClients(sampled, reporting, work)

