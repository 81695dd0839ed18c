"""FedProx (Li et al., MLSys 2020): FedAvg whose clients add a proximal term.

    client: w_{k+1} = w_k - eta_c (g_k + mu (w_k - w_r))
    server: as FedAvg

mu = 0 is FedAvg. TFF 0.87's `build_weighted_fed_prox` adds mu (w_r - w_k), the
opposite sign; with that sign flipped this equals it (tests/test_parity.py).
"""

import tensorflow_federated as tff

from tff_comp import registry
from tff_comp.algorithms import common
from tff_comp.learning_process import aggregation_factories
from tff_comp.ops import algorithm as algorithm_lib
from tff_comp.ops import sgd


@registry.register_algorithm('fedprox', home_task='lasso')
def fedprox(
  model: tff.learning.models.FunctionalModel,
  *,
  client_learning_rate: float,
  mu: float = 0.01,
  server_learning_rate: float = 1.0,
  server_momentum: float = 0.0,
  batch_size: int = 10,
  local_epochs: int = 1,
  local_epochs_max: int = 0,
  local_steps: int = 0,
  seed: int = 0,
  client_weighting: str = 'examples',
  server_optimizer: tff.learning.optimizers.Optimizer | None = None,
  model_aggregator: aggregation_factories.ModelAggregator | None = None,
) -> algorithm_lib.Algorithm:
  """Builds FedProx with proximal strength `mu`.

  Args:
    mu: proximal strength: clients add mu (w - w_r) to their gradients; 0 is FedAvg.
    server_momentum: heavy-ball momentum of the server SGD (0: plain SGD).
    local_epochs_max: if > 0, each client draws its epochs every round from
      [local_epochs, local_epochs_max] and takes floor(E n_i / B) steps.
    local_steps: if > 0, every client takes exactly this many steps of batch_size
      examples a round, cycling through its examples, in place of local_epochs (the
      fixed K of SCAFFOLD and of Karimireddy, He and Jaggi 2022).
  """
  common.check_positive(client_learning_rate=client_learning_rate)
  common.check_nonnegative(mu=mu)
  rule = sgd.SGD(model, learning_rate=client_learning_rate, proximal_strength=mu)
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
    rule,
    options,
    server_learning_rate=server_learning_rate,
    server_momentum=server_momentum,
    server_optimizer=server_optimizer,
    model_aggregator=model_aggregator,
  )


build_fedprox = common.process_builder(fedprox)
