"""Learning-rate schedules over rounds. The rate at round t (1-based) is base * factor(t),
set through the process's hparams before the round, so one built process serves any
schedule and a resumed run lands on the same rates:

    constant      1
    exponential   decay_rate ** ((t - 1) / decay_rounds), continuously
                  (staircase: decay_rate ** floor((t - 1) / decay_rounds), in steps)
    inverse_sqrt  t / warmup_rounds up to warmup_rounds, then sqrt(warmup_rounds / t)
"""

import dataclasses
import math

from tff_comp import settings

NAMES = ('constant', 'exponential', 'inverse_sqrt')


@dataclasses.dataclass(frozen=True)
class Schedule:
  """One schedule (see the module docstring); raises ValueError for bad values."""

  name: str = 'constant'
  decay_rate: float = 0.5
  decay_rounds: int = 100
  warmup_rounds: int = 10
  staircase: bool = False

  def __post_init__(self):
    if self.name not in NAMES:
      raise ValueError(
        f'learning-rate schedule {self.name!r} is unknown; choose one of {", ".join(NAMES)}.'
      )
    if not 0 < self.decay_rate <= 1:
      raise ValueError(f'--lr_decay_rate must be in (0, 1], got {self.decay_rate}.')
    for label, value in (
      ('lr_decay_rounds', self.decay_rounds),
      ('lr_warmup_rounds', self.warmup_rounds),
    ):
      if value < 1:
        raise ValueError(f'--{label} must be >= 1, got {value}.')

  @property
  def constant(self) -> bool:
    return self.name == 'constant'

  def factor(self, round_num: int) -> float:
    if self.name == 'exponential':
      periods = (round_num - 1) / self.decay_rounds
      return self.decay_rate ** (math.floor(periods) if self.staircase else periods)
    if self.name == 'inverse_sqrt':
      return min(round_num / self.warmup_rounds, math.sqrt(self.warmup_rounds / round_num))
    return 1.0


@dataclasses.dataclass(frozen=True)
class ScheduleOptions:
  """The run's client and server learning-rate schedules (`--client_lr_schedule` ...)."""

  client_lr_schedule: str = settings.setting(
    'constant',
    'The client learning rate over rounds: constant, exponential (times'
    ' --lr_decay_rate every --lr_decay_rounds rounds, continuously; --lr_staircase: in'
    ' steps) or inverse_sqrt (linear warmup over --lr_warmup_rounds, then'
    ' sqrt(warmup / round)).',
    choices=NAMES,
  )
  server_lr_schedule: str = settings.setting(
    'constant', 'The server learning rate over rounds (as --client_lr_schedule).', choices=NAMES
  )
  lr_decay_rate: float = settings.setting(
    0.5, "Exponential schedules' factor per --lr_decay_rounds rounds, in (0, 1]."
  )
  lr_decay_rounds: int = settings.setting(
    100,
    'Rounds over which an exponential schedule decays by --lr_decay_rate.',
    lower=1,
    upper=settings.MAX_COUNT,
  )
  lr_warmup_rounds: int = settings.setting(
    10, 'Warmup rounds of an inverse_sqrt schedule.', lower=1, upper=settings.MAX_COUNT
  )
  lr_staircase: bool = settings.setting(
    False,
    'Exponential schedules decay in steps, by --lr_decay_rate at the end of every'
    ' --lr_decay_rounds rounds (default: continuously, a little every round).',
  )

  def __post_init__(self):
    settings.check(self)
    self.pair()

  def pair(self) -> tuple[Schedule, Schedule]:
    """The (client, server) schedules."""
    client, server = (
      Schedule(
        name, self.lr_decay_rate, self.lr_decay_rounds, self.lr_warmup_rounds, self.lr_staircase
      )
      for name in (self.client_lr_schedule, self.server_lr_schedule)
    )
    return client, server
