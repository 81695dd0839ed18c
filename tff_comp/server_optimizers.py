"""Server optimizers by name, for `--server_optimizer`: FedAvgM (sgdm) and the adaptive
FedAdam, FedYogi and FedAdagrad of Reddi et al. (ICLR 2021), as TFF's own functional
optimizers (`tff.learning.optimizers`), which every runtime here runs as given.

The server treats the aggregated client update as a pseudo-gradient. Defaults follow
Reddi et al.: beta_1 = 0.9, beta_2 = 0.99 and the adaptivity epsilon (their tau) = 1e-3;
`beta_1` is SGDM's momentum.
"""

import tensorflow_federated as tff

NAMES = ('sgd', 'sgdm', 'adam', 'yogi', 'adagrad')


def build(name: str, learning_rate: float, *, beta_1: float = 0.9, beta_2: float = 0.99,
          epsilon: float = 1e-3) -> tff.learning.optimizers.Optimizer:
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
    return tff.learning.optimizers.build_adam(learning_rate, beta_1=beta_1, beta_2=beta_2,
                                              epsilon=epsilon)
  if name == 'yogi':
    return tff.learning.optimizers.build_yogi(learning_rate, beta_1=beta_1, beta_2=beta_2,
                                              epsilon=epsilon)
  # Adagrad has no moments: its epsilon only (TFF's initial accumulator, 0.1, stays).
  return tff.learning.optimizers.build_adagrad(learning_rate, epsilon=epsilon)
