"""q-FedAvg (q-FFL; Li, Sanjabi, Beirami, Smith, ICLR 2020): fair resource allocation.

Each sampled client runs local SGD from w (w_local), reports Delta_i = F_i^q Dw_i and
h_i = q F_i^(q-1) ||Dw_i||^2 + L F_i^q with Dw_i = L (w - w_local), L = 1/eta_c and
F_i its loss at w; the server takes w <- w - sum Delta_i / sum h_i. Larger q weighs
high-loss clients more; q = 0 is FedAvg with uniform client weights.
"""

import tensorflow_federated as tff

from tff_comp import registry
from tff_comp.algorithms import common
from tff_comp.learning_process import aggregation_factories
from tff_comp.ops import algorithm as algorithm_lib
from tff_comp.ops import client_round, model_ops, sgd


@registry.register_algorithm('qfedavg', home_task='imbalanced_digits')
def qfedavg(
  model: tff.learning.models.FunctionalModel,
  *,
  client_learning_rate: float,
  q: float = 0.2,
  batch_size: int = 10,
  local_epochs: int = 1,
  model_aggregator: aggregation_factories.ModelAggregator | None = None,
) -> algorithm_lib.Algorithm:
  """Builds q-FedAvg with fairness parameter `q` (the paper's DRFL baseline: 0.2).

  Args:
    q: fairness parameter of q-FFL: the larger, the more weight on clients with a high
      loss (0: uniform FedAvg).
  """
  common.check_positive(client_learning_rate=client_learning_rate)
  common.check_nonnegative(q=q)
  rule = sgd.FairnessWeightedSGD(model, learning_rate=client_learning_rate, q=q)
  options = client_round.ClientOptions(batch_size, local_epochs, weighting='uniform')
  return common.algorithm(
    model,
    rule,
    sgd.RatioServer(model_ops.trainable_specs(model)),
    options,
    model_aggregator=model_aggregator,
  )


build_qfedavg = common.process_builder(qfedavg)
