"""FedNova (Wang, Liu, Liang, Joshi, Poor, NeurIPS 2020): normalized averaging.

Client i runs tau_i local steps of SGD, SGD with momentum rho, or proximal SGD (mu),
so Delta_i = -eta G_i a_i, and reports ||a_i||_1; the server applies

    w_{t+1} = w_t + eta_s tau_eff sum_i p_i Delta_i / ||a_i||_1,  tau_eff = sum_i p_i ||a_i||_1

(or any server optimizer; `server_momentum` > 0 gives FedNova with server momentum).
With equal tau_i (and equal a_i) it is FedAvg. Heterogeneous local work: epochs
drawn per client per round from [local_epochs, local_epochs_max] (`fedavg` and
`fedprox` take the same options, so the three compare on equal footing).
"""

import tensorflow_federated as tff

from tff_comp import registry
from tff_comp.algorithms import common
from tff_comp.learning_process import aggregation_factories
from tff_comp.ops import algorithm as algorithm_lib
from tff_comp.ops import client_round, sgd, update_aggregation


# Home: Wang et al.'s Synthetic(1, 1) with local epochs drawn from U(2, 5).
@registry.register_algorithm(
  'fednova',
  home_task='synthetic',
  home_settings=dict(local_epochs=2, local_epochs_max=5, batch_size=50),
)
def fednova(
  model: tff.learning.models.FunctionalModel,
  *,
  client_learning_rate: float,
  server_learning_rate: float = 1.0,
  server_momentum: float = 0.0,
  client_momentum: float = 0.0,
  mu: float = 0.0,
  batch_size: int = 10,
  local_epochs: int = 1,
  local_epochs_max: int = 0,
  seed: int = 0,
  client_weighting: str = 'examples',
  server_optimizer: tff.learning.optimizers.Optimizer | None = None,
  model_aggregator: aggregation_factories.ModelAggregator | None = None,
) -> algorithm_lib.Algorithm:
  """Builds FedNova; local solver: SGD, momentum (client_momentum) or prox (mu).

  Args:
    server_momentum: heavy-ball momentum of the server SGD (0: plain SGD).
    client_momentum: momentum rho of the clients' local SGD (0: none); ||a_i||_1
      accounts for it.
    mu: proximal strength of a FedProx local solver (0: none); ||a_i||_1 accounts for
      it.
    local_epochs_max: if > 0, each client draws its epochs every round from
      [local_epochs, local_epochs_max] and takes floor(E n_i / B) steps.
  """
  common.check_positive(client_learning_rate=client_learning_rate)
  common.check_nonnegative(mu=mu, client_momentum=client_momentum)
  rule = sgd.NormalizedSGD(
    sgd.SGD(
      model, learning_rate=client_learning_rate, proximal_strength=mu, momentum=client_momentum
    )
  )
  options = client_round.ClientOptions(
    batch_size, local_epochs, local_epochs_max or None, seed=seed, weighting=client_weighting
  )
  return common.fedavg_like(
    model,
    rule,
    options,
    server_learning_rate=server_learning_rate,
    server_momentum=server_momentum,
    server_optimizer=server_optimizer,
    aggregation_kind=update_aggregation.NORMALIZED,
    model_aggregator=model_aggregator,
  )


build_fednova = common.process_builder(fednova)
