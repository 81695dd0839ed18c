"""Per-FedAvg (Fallah, Mokhtari, Ozdaglar, NeurIPS 2020): personalized FedAvg via MAML.

Objective: min_w (1/n) sum_i f_i(w - alpha grad f_i(w)). Clients take `local_steps`
steps (three independent batches each: D, D', D'')

    w <- w - beta (I - alpha H_i(w; D'')) grad f_i(w - alpha grad f_i(w; D); D')

with the Hessian-vector product exact (autodiff), dropped (`fo`) or by finite
differences (`hf`, step `delta`); beta is the client learning rate. The server takes
the mean of client models. The exact meta-gradient can be several times larger than
the first-order one at initialization; it may need a smaller beta.
"""

import tensorflow_federated as tff

from tff_comp import registry
from tff_comp.algorithms import common
from tff_comp.learning_process import aggregation_factories
from tff_comp.ops import algorithm as algorithm_lib
from tff_comp.ops import client_round, maml


@registry.register_algorithm(
  'per_fedavg', home_task='sinewave', divergence_hint=maml.DIVERGENCE_HINT
)
def per_fedavg(
  model: tff.learning.models.FunctionalModel,
  *,
  client_learning_rate: float,
  alpha: float = 0.01,
  variant: maml.Variant = 'fo',
  delta: float = 1e-3,
  local_steps: int = 10,
  server_learning_rate: float = 1.0,
  batch_size: int = 5,
  client_weighting: str = 'uniform',
  server_optimizer: tff.learning.optimizers.Optimizer | None = None,
  model_aggregator: aggregation_factories.ModelAggregator | None = None,
) -> algorithm_lib.Algorithm:
  """Builds Per-FedAvg; `variant` is 'exact', 'fo' or 'hf'.

  Args:
    alpha: inner (adaptation) step size of each MAML step.
    variant: the Hessian-vector product of the meta-gradient: 'exact' (autodiff), 'fo'
      (dropped: first order) or 'hf' (finite differences with delta).
    delta: finite-difference step of the 'hf' Hessian-vector estimate.
    local_steps: MAML steps per round, three batches each.
  """
  common.check_positive(client_learning_rate=client_learning_rate, alpha=alpha, delta=delta)
  rule = maml.PerFedAvg(
    model, learning_rate=client_learning_rate, alpha=alpha, variant=variant, delta=delta
  )
  options = client_round.ClientOptions(
    batch_size, local_steps=local_steps, weighting=client_weighting
  )
  return common.fedavg_like(
    model,
    rule,
    options,
    server_learning_rate=server_learning_rate,
    server_optimizer=server_optimizer,
    model_aggregator=model_aggregator,
  )


build_per_fedavg = common.process_builder(per_fedavg)
