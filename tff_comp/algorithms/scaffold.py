"""SCAFFOLD (Karimireddy, Kale, Mohri, Reddi, Stich, Suresh, ICML 2020): local SGD
corrected by control variates, so client drift under heterogeneous data cancels.

    client: y <- y - eta_l (g_i(y) + c - c_i),  K steps from x;
            c_i+ = c_i - c + (x - y_K) / (K eta_l)                (option II)
    server: x <- x + eta_g mean_S (y_K^i - x);  c <- c + (1/N) sum_S (c_i+ - c_i)

eta_l is the client learning rate, eta_g the server's. Control variates start at 0 and
live in the server state, one row per client (clients receive datasets of
`client_work.IndexedExample`); clients not sampled keep theirs. The mean over the cohort
is uniform, as in the paper (`client_weighting='examples'` weighs by n_i). With c = c_i
= 0 the first round is FedAvg's.

Example:
    algorithm = scaffold(model, num_clients=100, client_learning_rate=0.05)
    process = build_scaffold(model, num_clients=100, client_learning_rate=0.05)
"""

import tensorflow_federated as tff

from tff_comp import registry
from tff_comp.algorithms import common
from tff_comp.learning_process import aggregation_factories
from tff_comp.ops import algorithm as algorithm_lib
from tff_comp.ops import model_ops, update_aggregation
from tff_comp.ops import scaffold as scaffold_lib


@registry.register_algorithm('scaffold', home_task='synthetic')
def scaffold(
  model: tff.learning.models.FunctionalModel,
  *,
  num_clients: int,
  client_learning_rate: float,
  server_learning_rate: float = 1.0,
  batch_size: int = 10,
  local_epochs: int = 1,
  local_steps: int = 0,
  client_weighting: str = 'uniform',
  server_optimizer: tff.learning.optimizers.Optimizer | None = None,
  model_aggregator: aggregation_factories.ModelAggregator | None = None,
) -> algorithm_lib.Algorithm:
  """SCAFFOLD over `num_clients` clients (option II control variates).

  Args:
    local_steps: if > 0, every client takes exactly this many steps of batch_size
      examples a round, cycling through its examples, in place of local_epochs (the
      fixed K of SCAFFOLD and of Karimireddy, He and Jaggi 2022).
  """
  common.check_positive(client_learning_rate=client_learning_rate, num_clients=num_clients)
  rule = scaffold_lib.ScaffoldClient(
    model, learning_rate=client_learning_rate, num_clients=num_clients
  )
  server_rule = scaffold_lib.ControlVariateServer(
    model_ops.trainable_specs(model),
    server_optimizer or common.server_sgd(server_learning_rate),
    num_clients=num_clients,
  )
  return common.algorithm(
    model,
    rule,
    server_rule,
    common.local_sgd_options(
      batch_size, local_epochs, local_steps=local_steps, weighting=client_weighting
    ),
    aggregation_kind=update_aggregation.SLOTS,
    model_aggregator=model_aggregator,
  )


build_scaffold = common.process_builder(scaffold)
