"""Server optimizers by name, for `--server_optimizer`: FedAvgM (sgdm) and the adaptive
FedAdam, FedYogi and FedAdagrad of Reddi et al. (ICLR 2021), as TFF's own functional
optimizers (`tff.learning.optimizers`), which every runtime here runs as given.

The server treats the aggregated client update as a pseudo-gradient. Defaults follow
Reddi et al.: beta_1 = 0.9, beta_2 = 0.99 and the adaptivity epsilon (their tau) = 1e-3;
`beta_1` is SGDM's momentum.
"""

import dataclasses

import tensorflow_federated as tff

from tff_comp import settings

NAMES = ('sgd', 'sgdm', 'adam', 'yogi', 'adagrad')


def build(
  name: str,
  learning_rate: float,
  *,
  beta_1: float = 0.9,
  beta_2: float = 0.99,
  epsilon: float = 1e-3,
) -> tff.learning.optimizers.Optimizer:
  """The server optimizer `name` (one of `NAMES`) at `learning_rate`.

  Raises:
    ValueError: an unknown name, or a hyperparameter outside its range.
  """
  if name not in NAMES:
    raise ValueError(f'server optimizer {name!r} is unknown; choose one of {", ".join(NAMES)}.')
  if not learning_rate > 0:
    raise ValueError(f'the server learning rate must be > 0, got {learning_rate}.')
  for label, value in (('server_beta_1', beta_1), ('server_beta_2', beta_2)):
    if not 0 <= value < 1:
      raise ValueError(f'--{label} must be in [0, 1), got {value}.')
  if not epsilon > 0:
    raise ValueError(f'--server_epsilon must be > 0, got {epsilon}.')
  if name == 'sgd':
    return tff.learning.optimizers.build_sgdm(learning_rate)
  if name == 'sgdm':
    return tff.learning.optimizers.build_sgdm(learning_rate, momentum=beta_1)
  if name == 'adam':
    return tff.learning.optimizers.build_adam(
      learning_rate, beta_1=beta_1, beta_2=beta_2, epsilon=epsilon
    )
  if name == 'yogi':
    return tff.learning.optimizers.build_yogi(
      learning_rate, beta_1=beta_1, beta_2=beta_2, epsilon=epsilon
    )
  # Adagrad has no moments: its epsilon only (TFF's initial accumulator, 0.1, stays).
  return tff.learning.optimizers.build_adagrad(learning_rate, epsilon=epsilon)


@dataclasses.dataclass(frozen=True)
class ServerOptimizerOptions:
  """`--server_optimizer` and its hyperparameters (None: `build`'s defaults)."""

  server_optimizer: str | None = settings.setting(
    None,
    "The server's optimizer at --server_learning_rate, for algorithms whose"
    " server runs one (default: the algorithm's own, SGD): sgdm (FedAvgM), adam, yogi,"
    ' adagrad (FedAdam, FedYogi, FedAdagrad of Reddi et al. 2021).',
    choices=NAMES,
  )
  server_beta_1: float | None = settings.setting(
    None, "The server optimizer's first-moment decay (sgdm: its momentum; default 0.9).", lower=0.0
  )
  server_beta_2: float | None = settings.setting(
    None, "The server optimizer's second-moment decay (adam, yogi; default 0.99).", lower=0.0
  )
  server_epsilon: float | None = settings.setting(
    None, "The adaptive server optimizers' epsilon (Reddi et al.'s tau; default 1e-3)."
  )

  def __post_init__(self):
    settings.check(self)
    if self.server_optimizer is None and self._given():
      raise ValueError(
        f'--server_{next(iter(self._given()))} without --server_optimizer:'
        " it sets that optimizer's hyperparameters."
      )

  def _given(self) -> dict[str, float]:
    return {
      name: getattr(self, f'server_{name}')
      for name in ('beta_1', 'beta_2', 'epsilon')
      if getattr(self, f'server_{name}') is not None
    }

  def build(self, learning_rate: float) -> tff.learning.optimizers.Optimizer | None:
    """The optimizer at `learning_rate` (None: none chosen). Raises ValueError."""
    if self.server_optimizer is None:
      return None
    return build(self.server_optimizer, learning_rate, **self._given())
