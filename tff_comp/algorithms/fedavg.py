"""Federated Averaging (McMahan et al., AISTATS 2017).

    client: w_{k+1} = w_k - eta_c g_k,  k < K, from the broadcast w_r
    server: w_{r+1} = w_r + eta_s Delta,  Delta = mean_m (w_K^m - w_r)

(or any `tff.learning.optimizers` optimizer fed -Delta). `fedavg_subgrad` adds a
subgradient of the regularizer psi to client gradients: the naive composite baseline
of Yuan et al. (ICML 2021). Equals `tff.learning.algorithms.build_weighted_fed_avg` on the
same inputs (tested).

Example:
    algorithm = fedavg(model, client_learning_rate=0.01, batch_size=10)   # any runtime
    process = build_fedavg(model, client_learning_rate=0.01, batch_size=10)  # TFF
"""

import tensorflow_federated as tff

from tff_comp import registry
from tff_comp.algorithms import common
from tff_comp.learning_process import aggregation_factories
from tff_comp.ops import algorithm as algorithm_lib
from tff_comp.ops import client_round, sgd
from tff_comp.ops import regularizers as regularizers_lib


@registry.register_algorithm('fedavg', home_task='lasso')
def fedavg(
  model: tff.learning.models.FunctionalModel,
  *,
  client_learning_rate: float,
  server_learning_rate: float = 1.0,
  server_momentum: float = 0.0,
  client_momentum: float = 0.0,
  batch_size: int = 10,
  local_epochs: int = 1,
  local_epochs_max: int = 0,
  local_steps: int = 0,
  seed: int = 0,
  client_weighting: str = 'examples',
  server_optimizer: tff.learning.optimizers.Optimizer | None = None,
  model_aggregator: aggregation_factories.ModelAggregator | None = None,
) -> algorithm_lib.Algorithm:
  """Builds FedAvg; `server_optimizer` overrides server SGD(eta_s, momentum).

  `local_epochs_max` > 0: epochs drawn per client per round (`ops.local_loop.plan`).
  Args:
    server_momentum: heavy-ball momentum of the server SGD (0: plain SGD).
    client_momentum: heavy-ball momentum rho of the clients' local SGD, v <- rho v + g,
      w <- w - eta_c v, the velocity reset every round (0: plain local SGD).
    local_epochs_max: if > 0, each client draws its epochs every round from
      [local_epochs, local_epochs_max] and takes floor(E n_i / B) steps (FedNova's
      heterogeneous setting).
    local_steps: if > 0, every client takes exactly this many steps of batch_size
      examples a round, cycling through its examples, in place of local_epochs (the
      fixed K of SCAFFOLD and of Karimireddy, He and Jaggi 2022).
  """
  common.check_positive(client_learning_rate=client_learning_rate)
  common.check_nonnegative(client_momentum=client_momentum)
  options = common.local_sgd_options(
    batch_size,
    local_epochs,
    local_epochs_max=local_epochs_max,
    local_steps=local_steps,
    seed=seed,
    weighting=client_weighting,
  )
  return common.fedavg_like(
    model,
    sgd.SGD(model, learning_rate=client_learning_rate, momentum=client_momentum),
    options,
    server_learning_rate=server_learning_rate,
    server_momentum=server_momentum,
    server_optimizer=server_optimizer,
    model_aggregator=model_aggregator,
  )


@registry.register_algorithm('fedavg_subgrad', home_task='lasso')
def fedavg_subgradient(
  model: tff.learning.models.FunctionalModel,
  *,
  regularizer: regularizers_lib.Regularizer,
  client_learning_rate: float,
  server_learning_rate: float = 1.0,
  server_momentum: float = 0.0,
  batch_size: int = 10,
  local_epochs: int = 1,
  client_weighting: str = 'uniform',
  server_optimizer: tff.learning.optimizers.Optimizer | None = None,
  model_aggregator: aggregation_factories.ModelAggregator | None = None,
) -> algorithm_lib.Algorithm:
  """Builds FedAvg whose clients step along g_k + a subgradient of psi at w_k.

  Args:
    server_momentum: heavy-ball momentum of the server SGD (0: plain SGD).
  """
  common.check_positive(client_learning_rate=client_learning_rate)
  rule = sgd.SGD(model, learning_rate=client_learning_rate, subgradient_of=regularizer)
  return common.fedavg_like(
    model,
    rule,
    client_round.ClientOptions(batch_size, local_epochs, weighting=client_weighting),
    server_learning_rate=server_learning_rate,
    server_momentum=server_momentum,
    server_optimizer=server_optimizer,
    model_aggregator=model_aggregator,
  )


build_fedavg = common.process_builder(fedavg)
build_fedavg_subgradient = common.process_builder(fedavg_subgradient)
