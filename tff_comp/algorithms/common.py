"""Shared argument handling for algorithm builders."""

import tensorflow_federated as tff

from tff_comp import client_work as client_work_lib
from tff_comp import composer
from tff_comp import server_updates

WEIGHTINGS = {
    'examples': tff.learning.ClientWeighting.NUM_EXAMPLES,
    'uniform': tff.learning.ClientWeighting.UNIFORM,
}


def client_weighting_of(name: str) -> tff.learning.ClientWeighting:
  """'examples' or 'uniform' as a tff.learning.ClientWeighting."""
  if name not in WEIGHTINGS:
    raise ValueError(
        f'client_weighting={name!r} is unknown; choose one of {sorted(WEIGHTINGS)}.'
    )
  return WEIGHTINGS[name]


def check_positive(**values: float) -> None:
  """Raises ValueError naming the first argument that is not > 0."""
  for name, value in values.items():
    if not value > 0:
      raise ValueError(f'{name} must be > 0, got {value}.')


def check_nonnegative(**values: float) -> None:
  for name, value in values.items():
    if not value >= 0:
      raise ValueError(f'{name} must be >= 0, got {value}.')


def initial_weights_fn(model: tff.learning.models.FunctionalModel) -> tff.Computation:
  """A no-arg TF computation returning the model's initial ModelWeights."""
  @tff.tensorflow.computation
  def initial_weights():
    trainable, non_trainable = model.initial_weights
    return tff.learning.models.ModelWeights(trainable, non_trainable)

  return initial_weights


def server_sgd(learning_rate: float, momentum: float) -> tff.learning.optimizers.Optimizer:
  """SGD (with heavy-ball momentum when momentum > 0) at the server."""
  check_positive(server_learning_rate=learning_rate)
  check_nonnegative(server_momentum=momentum)
  return tff.learning.optimizers.build_sgdm(
      learning_rate=learning_rate, momentum=momentum or None
  )


def compose(
    model: tff.learning.models.FunctionalModel,
    rule,
    server_update: server_updates.ServerUpdateProcess,
    *,
    batch_size: int,
    local_epochs: int,
    client_weighting: str,
    aggregator: tff.aggregators.WeightedAggregationFactory | None = None,
    local_epochs_max: int = 0,
    seed: int = 0,
    local_steps: int | None = None,
) -> tff.learning.templates.LearningProcess:
  """Clients run `rule` from the server update's payload; the mean (or
  `aggregator`) of their updates goes to `server_update`. `local_epochs_max` > 0
  draws epochs per client per round (heterogeneous local work)."""
  return composer.compose_learning_process(
      initial_model_weights_fn=initial_weights_fn(model),
      client_work=client_work_lib.build_local_client_work(
          rule,
          server_update.client_payload.type_signature.result,
          batch_size=batch_size,
          local_epochs=local_epochs,
          local_epochs_max=local_epochs_max or None,
          local_steps=local_steps,
          seed=seed,
          client_weighting=client_weighting_of(client_weighting),
      ),
      aggregator=aggregator or tff.aggregators.MeanFactory(),
      server_update=server_update,
  )


def compose_composite(
    model: tff.learning.models.FunctionalModel,
    *,
    rule_class,
    server_update_builder,
    regularizer,
    client_learning_rate: float,
    server_learning_rate: float,
    batch_size: int,
    local_epochs: int,
    client_weighting: str,
    client_prox: bool,
    aggregator: tff.aggregators.WeightedAggregationFactory | None = None,
) -> tff.learning.templates.LearningProcess:
  """A composite-optimization algorithm: a rule of `rule_class` (ProximalSGD or
  DualAveraging) on clients, `server_update_builder(SGD(eta_s), weights, psi)` at
  the server."""
  check_positive(client_learning_rate=client_learning_rate)
  rule = rule_class(model, learning_rate=client_learning_rate, regularizer=regularizer,
                    client_prox=client_prox)
  server_update = server_update_builder(
      server_sgd(server_learning_rate, 0.0), client_work_lib.model_weights_type(model),
      regularizer)
  return compose(model, rule, server_update, batch_size=batch_size,
                 local_epochs=local_epochs, client_weighting=client_weighting,
                 aggregator=aggregator)
