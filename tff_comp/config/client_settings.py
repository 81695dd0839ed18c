"""The run's local-work settings: how each client trains in a round (its learning rate,
batch size, epochs, weighting and example order), None taking the task's default.

`experiment.prepare` resolves them against the task's and the algorithm's defaults
(`ExperimentConfig.value`) and hands them to the algorithm's builder; the math's own
record is `ops.client_round.ClientOptions`.
"""

import dataclasses

from tff_comp import settings
from tff_comp.ops import client_round


@dataclasses.dataclass(frozen=True)
class LocalWorkOptions:
  """How each client trains in a round (None: the task's default)."""

  client_learning_rate: float | None = settings.setting(
    None, 'Client learning rate eta_c.', per_trial=True
  )
  batch_size: int | None = settings.setting(
    None, 'Examples per local step.', upper=settings.MAX_INT32
  )
  local_epochs: int | None = settings.setting(
    None, 'Local passes over client data per round.', upper=client_round.MAX_EPOCHS
  )
  client_weighting: str | None = settings.setting(
    None,
    "Weigh clients by examples or uniformly (default: the algorithm's).",
    choices=client_round.WEIGHTINGS,
  )
  shuffle: bool = settings.setting(
    True,
    'Each client visits its examples in a new order every round and epoch (a'
    ' stateless permutation of seed, round, client and epoch); --noshuffle: stored'
    ' order.',
  )

  def __post_init__(self):
    settings.check(self)
