"""Federated Averaging (McMahan et al., AISTATS 2017).

    client: w_{k+1} = w_k - eta_c g_k,  k < K, from the broadcast w_r
    server: w_{r+1} = w_r + eta_s Delta,  Delta = mean_m (w_K^m - w_r)

(or any `tff.learning.optimizers` optimizer fed -Delta). `fedavg_subgrad` adds a
subgradient of the regularizer psi to client gradients: the naive composite baseline
of Yuan et al. (ICML 2021). Equals `tff.learning.algorithms.build_weighted_fed_avg` on the
same inputs (tested).

Example:
    process = build_fedavg(model, client_learning_rate=0.01, batch_size=10)
"""

import tensorflow_federated as tff

from tff_comp import client_work
from tff_comp import registry
from tff_comp import server_updates
from tff_comp import regularizers as regularizers_lib
from tff_comp.algorithms import common
from tff_comp.ops import client_updates


def compose_fedavg_like(
    model, rule, *, server_learning_rate, server_momentum, batch_size,
    local_epochs, client_weighting, server_optimizer=None, model_aggregator=None,
    local_epochs_max=0, seed=0, local_steps=None,
) -> tff.learning.templates.LearningProcess:
  """FedAvg's skeleton around any client rule: server optimizer on the mean update."""
  server_update = server_updates.build_optimizer_update(
      server_optimizer or common.server_sgd(server_learning_rate, server_momentum),
      client_work.model_weights_type(model),
  )
  return common.compose(
      model,
      rule,
      server_update,
      batch_size=batch_size,
      local_epochs=local_epochs,
      client_weighting=client_weighting,
      aggregator=model_aggregator,
      local_epochs_max=local_epochs_max,
      seed=seed,
      local_steps=local_steps,
  )


@registry.register_algorithm('fedavg')
def build_fedavg(
    model: tff.learning.models.FunctionalModel,
    *,
    client_learning_rate: float,
    server_learning_rate: float = 1.0,
    server_momentum: float = 0.0,
    batch_size: int = 10,
    local_epochs: int = 1,
    local_epochs_max: int = 0,
    seed: int = 0,
    client_weighting: str = 'examples',
    server_optimizer: tff.learning.optimizers.Optimizer | None = None,
    model_aggregator: tff.aggregators.WeightedAggregationFactory | None = None,
) -> tff.learning.templates.LearningProcess:
  """Builds FedAvg; `server_optimizer` overrides server SGD(eta_s, momentum).

  `local_epochs_max` > 0: epochs drawn per client per round (see client_work).
  """
  common.check_positive(client_learning_rate=client_learning_rate)
  rule = client_updates.SGD(model, learning_rate=client_learning_rate)
  return compose_fedavg_like(
      model, rule, server_learning_rate=server_learning_rate,
      server_momentum=server_momentum, batch_size=batch_size,
      local_epochs=local_epochs, client_weighting=client_weighting,
      server_optimizer=server_optimizer, model_aggregator=model_aggregator,
      local_epochs_max=local_epochs_max, seed=seed,
  )


@registry.register_algorithm('fedavg_subgrad')
def build_fedavg_subgradient(
    model: tff.learning.models.FunctionalModel,
    *,
    regularizer: regularizers_lib.Regularizer,
    client_learning_rate: float,
    server_learning_rate: float = 1.0,
    server_momentum: float = 0.0,
    batch_size: int = 10,
    local_epochs: int = 1,
    client_weighting: str = 'uniform',
) -> tff.learning.templates.LearningProcess:
  """Builds FedAvg whose clients step along g_k + a subgradient of psi at w_k."""
  common.check_positive(client_learning_rate=client_learning_rate)
  rule = client_updates.SGD(
      model, learning_rate=client_learning_rate, subgradient_of=regularizer
  )
  return compose_fedavg_like(
      model, rule, server_learning_rate=server_learning_rate,
      server_momentum=server_momentum, batch_size=batch_size,
      local_epochs=local_epochs, client_weighting=client_weighting,
  )
