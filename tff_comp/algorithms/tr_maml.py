"""TR-MAML: task-robust MAML (Collins, Mokhtari, Shakkottai, NeurIPS 2020), a baseline
of the ComFedL paper's DA-MAML experiment.

    min_w max_{p in simplex} sum_i p_i L_i(w - alpha grad L_i(w))

Clients take first-order MAML steps (as Per-FedAvg `fo`); the server applies the
p-weighted mean update and ascends on p by exponentiated gradient on the clients'
post-adaptation losses. p is per client, so clients receive IndexedExamples (as AFL).
"""

import tensorflow_federated as tff

from tff_comp import registry
from tff_comp.algorithms import common
from tff_comp.learning_process import aggregation_factories
from tff_comp.ops import algorithm as algorithm_lib
from tff_comp.ops import client_round, maml, model_ops, per_client, update_aggregation


# Home: the ComFedL paper's DA-MAML setup (inner step 0.05, 5 local steps).
@registry.register_algorithm(
  'tr_maml',
  home_task='dominant_class',
  home_settings=dict(alpha=0.05, local_steps=5),
  divergence_hint=maml.DIVERGENCE_HINT,
)
def tr_maml(
  model: tff.learning.models.FunctionalModel,
  *,
  num_clients: int,
  client_learning_rate: float,
  alpha: float = 0.01,
  task_weight_learning_rate: float = 0.1,
  local_steps: int = 10,
  server_learning_rate: float = 1.0,
  batch_size: int = 5,
  server_optimizer: tff.learning.optimizers.Optimizer | None = None,
  model_aggregator: aggregation_factories.ModelAggregator | None = None,
) -> algorithm_lib.Algorithm:
  """Builds TR-MAML; `task_weight_learning_rate` is the exponentiated-gradient step.

  Args:
    alpha: inner (adaptation) step size of the first-order MAML steps.
    task_weight_learning_rate: step size of the exponentiated-gradient ascent on the
      task weights.
    local_steps: MAML steps per round.
  """
  common.check_positive(
    client_learning_rate=client_learning_rate,
    alpha=alpha,
    task_weight_learning_rate=task_weight_learning_rate,
  )
  rule = per_client.AgnosticWeighted(
    maml.PerFedAvg(model, learning_rate=client_learning_rate, alpha=alpha, variant='fo'),
    num_clients=num_clients,
  )
  server_rule = per_client.AgnosticServer(
    model_ops.trainable_specs(model),
    server_optimizer or common.server_sgd(server_learning_rate),
    num_clients=num_clients,
    lambda_learning_rate=task_weight_learning_rate,
    ascent='exponentiated',
  )
  return common.algorithm(
    model,
    rule,
    server_rule,
    client_round.ClientOptions(batch_size, local_steps=local_steps, weighting='uniform'),
    aggregation_kind=update_aggregation.SLOTS,
    model_aggregator=model_aggregator,
  )


build_tr_maml = common.process_builder(tr_maml)
