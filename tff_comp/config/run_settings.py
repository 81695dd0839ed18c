"""A run's settings resolved: each given setting, else the task's default (the
algorithm's own on its home task), checked, as one frozen record (`RunSettings`) that
the run reads and config.json records under `resolved`."""

import dataclasses
from typing import Any

from tff_comp import settings as settings_lib
from tff_comp import task as task_lib

# The run settings a task's (and a home pair's) defaults fill, and their fallbacks.
DEFAULTED = (
  'rounds',
  'clients_per_round',
  'client_learning_rate',
  'server_learning_rate',
  'batch_size',
  'local_epochs',
  'eval_period',
)
_FALLBACK = dict(
  rounds=100,
  clients_per_round=10,
  server_learning_rate=1.0,
  batch_size=10,
  local_epochs=1,
  eval_period=10,
)
# Recorded only where a run sets them (a DP run's), as config.json always had them.
_ONLY_WHEN_SET = (
  'client_weighting',
  'noise_multiplier',
  'target_delta',
  'restart_every',
  'bands',
  'strategy_rounds',
)


@dataclasses.dataclass(frozen=True)
class RunSettings:
  """The settings in force for a run.

  Attributes:
    rounds, clients_per_round, client_learning_rate, server_learning_rate, batch_size,
      local_epochs, eval_period: as given, else the task's defaults (`DEFAULTED`).
    regularizer, regularizer_strength: psi in force (None: the algorithm takes none).
    client_weighting: 'uniform' where the aggregator requires it (DP), else None.
    noise_multiplier, target_delta: a DP run's, given or calibrated.
    restart_every: a DP-FTRL run's rounds a tree, given or its cyclic epoch.
    bands, strategy_rounds: a BandMF run's bands (given or defaulted) and its strategy's
      rounds (the first --rounds; a resume keeps them).
  """

  rounds: int
  clients_per_round: int
  client_learning_rate: float
  server_learning_rate: float
  batch_size: int
  local_epochs: int
  eval_period: int
  regularizer: str | None = None
  regularizer_strength: float | None = None
  client_weighting: str | None = None
  noise_multiplier: float | None = None
  target_delta: float | None = None
  restart_every: int | None = None
  bands: int | None = None
  strategy_rounds: int | None = None

  def record(self) -> dict[str, Any]:
    """What config.json's `resolved` holds of these."""
    return {
      k: v for k, v in dataclasses.asdict(self).items() if v is not None or k not in _ONLY_WHEN_SET
    }


def resolve(
  value, task: task_lib.Task, home: dict[str, Any], *, with_replacement: bool
) -> RunSettings:
  """The `DEFAULTED` settings: `value(name)` (a config's setting, None: not given), else
  `home`'s (the algorithm's on its home task), the task's defaults, the fallbacks.
  `with_replacement`: clients are drawn with replacement, so a cohort may exceed the
  population.

  Raises:
    ConfigError: a count below 1, a rate not above 0, a cohort larger than the task's
      population.
  """
  defaults = {**_FALLBACK, **task.defaults, **{k: v for k, v in home.items() if k in DEFAULTED}}
  values: dict[str, Any] = {
    name: defaults.get(name) if value(name) is None else value(name) for name in DEFAULTED
  }
  for name in ('rounds', 'clients_per_round', 'eval_period', 'batch_size', 'local_epochs'):
    if values[name] is None or values[name] < 1:
      raise settings_lib.ConfigError(f'--{name} must be >= 1, got {values[name]}.')
  for name in ('client_learning_rate', 'server_learning_rate'):
    if values[name] is None or not values[name] > 0:
      raise settings_lib.ConfigError(f'--{name} must be > 0, got {values[name]}.')
  if values['clients_per_round'] > task.num_clients and not with_replacement:
    raise settings_lib.ConfigError(
      f'--clients_per_round={values["clients_per_round"]} exceeds the'
      f' {task.num_clients} clients of task {task.name!r}.'
    )
  return RunSettings(**values)
