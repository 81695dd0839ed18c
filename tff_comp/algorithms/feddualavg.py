"""Federated Dual Averaging, FedDualAvg (Yuan, Zaheer, Reddi, ICML 2021), and -OSP.

The server keeps a dual state z (z_0 = w_0) and an elapsed coefficient c (c_0 = 0).

    client m: z_0^m = z_r; for k < K:
        w_k^m = prox_{(c_r + eta_c k) psi}(z_k^m)         (OSP: w_k^m = z_k^m)
        z_{k+1}^m = z_k^m - eta_c grad f(w_k^m; batch)
    server: z_{r+1} = z_r + eta_s mean_m(z_K^m - z_r)      (the dual-state mean)
            c_{r+1} = c_r + eta_s mean_m(sum eta_c)        (= eta_s eta_c (r+1) K)
            w_{r+1} = prox_{c_{r+1} psi}(z_{r+1})

Averaging in the dual and applying the prox once keeps sparse (low-rank) structure that
averaging primal models destroys. `get_model_weights` gives the primal w.
With psi = 0 it reduces to FedAvg.
"""

import tensorflow_federated as tff

from tff_comp import registry
from tff_comp.algorithms import common
from tff_comp.learning_process import aggregation_factories
from tff_comp.ops import algorithm as algorithm_lib
from tff_comp.ops import composite
from tff_comp.ops import regularizers as regularizers_lib


@registry.register_algorithm('feddualavg', home_task='lasso')
@registry.register_algorithm('feddualavg_osp', home_task='lasso', client_prox=False)
def feddualavg(
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
  """Builds FedDualAvg; `client_prox=False` is FedDualAvg-OSP (clients step on the dual
  without the prox).

  Args:
    client_prox: clients apply the prox at every local step (FedDualAvg); false: only
      the server does (FedDualAvg-OSP).
  """
  # The dual-state mean is the plain weighted mean: averaging is linear in the dual,
  # which is why dual averaging keeps the sparsity that primal averaging loses.
  return common.composite(
    model,
    composite.DualAveraging,
    composite.DualAveragingServer,
    regularizer,
    client_learning_rate=client_learning_rate,
    server_learning_rate=server_learning_rate,
    batch_size=batch_size,
    local_epochs=local_epochs,
    client_weighting=client_weighting,
    client_prox=client_prox,
    model_aggregator=model_aggregator,
  )


build_feddualavg = common.process_builder(feddualavg)
