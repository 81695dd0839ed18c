"""Ditto (Li, Hu, Beirami, Smith, ICML 2021): FedAvg on a global model w, and beside it
a personal model per client trained toward w,

    min_{v_i} f_i(v_i) + (lam / 2) ||v_i - w*||^2,   w* = argmin_w mean_i f_i(w).

Every round each sampled client runs local SGD on w (FedAvg's client) and, on the same
batches, v_i <- v_i - eta_p (grad f_i(v_i) + lam (v_i - w_r)). The server averages the
global updates and keeps the personal models in its state, one row per client (so
datasets carry the client's index: `client_work.indexed_dataset_computation`). The
process is a `composer.PersonalizedLearningProcess`: `get_personal_weights(state)`
returns them for evaluation. lam = 0 gives purely local models; lam -> infinity, the
global model.
"""

import tensorflow_federated as tff

from tff_comp import registry
from tff_comp.algorithms import common
from tff_comp.learning_process import aggregation_factories
from tff_comp.ops import algorithm as algorithm_lib
from tff_comp.ops import client_round, model_ops, per_client, sgd, update_aggregation


@registry.register_algorithm('ditto', home_task='dominant_class')
def ditto(
  model: tff.learning.models.FunctionalModel,
  *,
  num_clients: int,
  client_learning_rate: float,
  lam: float = 0.1,
  personal_learning_rate: float = 0.0,
  server_learning_rate: float = 1.0,
  batch_size: int = 10,
  local_epochs: int = 1,
  client_weighting: str = 'examples',
  server_optimizer: tff.learning.optimizers.Optimizer | None = None,
  model_aggregator: aggregation_factories.ModelAggregator | None = None,
) -> algorithm_lib.Algorithm:
  """Builds Ditto over `num_clients` clients; `personal_learning_rate` 0 ties eta_p to
  the client learning rate (also when that is later set through the hparams).
  Args:
    lam: pull of each personal model toward the global one: v <- v - eta_p (grad f_i(v)
      + lam (v - w)); 0 is plain local training.
    personal_learning_rate: step size eta_p of the personal models; 0 ties it to the
      client learning rate.
  """
  common.check_positive(client_learning_rate=client_learning_rate, num_clients=num_clients)
  common.check_nonnegative(lam=lam, personal_learning_rate=personal_learning_rate)
  rule = per_client.Ditto(
    sgd.SGD(model, learning_rate=client_learning_rate),
    num_clients=num_clients,
    lam=lam,
    personal_learning_rate=personal_learning_rate or None,
  )
  server_rule = per_client.PersonalModelsServer(
    model_ops.trainable_specs(model),
    server_optimizer or common.server_sgd(server_learning_rate),
    num_clients=num_clients,
  )
  return common.algorithm(
    model,
    rule,
    server_rule,
    client_round.ClientOptions(batch_size, local_epochs, weighting=client_weighting),
    aggregation_kind=update_aggregation.SLOTS,
    model_aggregator=model_aggregator,
  )


build_ditto = common.process_builder(ditto)
