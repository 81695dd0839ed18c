"""Federated Mirror Descent, FedMiD (Yuan, Zaheer, Reddi, ICML 2021), and FedMiD-OSP.

Problem: min_w (1/N) sum_m F_m(w) + psi(w), with h = 0.5||.||^2.

    client: w_{k+1} = prox_{eta_c psi}(w_k - eta_c g_k)         (OSP: plain SGD)
    server: w_{r+1} = prox_{eta_s eta_c K psi}(w_r + eta_s Delta)

Clients with unequal step counts: eta_c K is the clients' mean sum of eta_c.
With psi = 0 both reduce to FedAvg.
"""

import tensorflow_federated as tff

from tff_comp import registry
from tff_comp.algorithms import common
from tff_comp.learning_process import aggregation_factories
from tff_comp.ops import algorithm as algorithm_lib
from tff_comp.ops import composite
from tff_comp.ops import regularizers as regularizers_lib


@registry.register_algorithm('fedmid', home_task='lasso')
@registry.register_algorithm('fedmid_osp', home_task='lasso', client_prox=False)
def fedmid(
  model: tff.learning.models.FunctionalModel,
  *,
  regularizer: regularizers_lib.Regularizer,
  client_learning_rate: float,
  server_learning_rate: float = 1.0,
  batch_size: int = 10,
  local_epochs: int = 1,
  client_weighting: str = 'uniform',
  client_prox: bool = True,
  model_aggregator: aggregation_factories.ModelAggregator | None = None,
) -> algorithm_lib.Algorithm:
  """Builds FedMiD; `client_prox=False` is FedMiD-OSP (clients run plain SGD; only the
  server applies the prox).

  Args:
    client_prox: clients take proximal steps (FedMiD); false: plain local SGD, only the
      server applies the prox (FedMiD-OSP).
  """
  return common.composite(
    model,
    composite.ProximalSGD,
    composite.MirrorDescentServer,
    regularizer,
    client_learning_rate=client_learning_rate,
    server_learning_rate=server_learning_rate,
    batch_size=batch_size,
    local_epochs=local_epochs,
    client_weighting=client_weighting,
    client_prox=client_prox,
    model_aggregator=model_aggregator,
  )


build_fedmid = common.process_builder(fedmid)
