"""Agnostic federated learning, AFL (Mohri, Sivek, Suresh, ICML 2019), the DRFL
baseline of the ComFedL paper.

    min_w max_{lambda in simplex} sum_i lambda_i F_i(w)

Clients run local SGD from w; the server applies the lambda-weighted mean update and
ascends on lambda: lambda <- Proj_simplex(lambda + lr_lambda * (F_i(w))_i). Lambda is
indexed by client, so clients receive datasets of `client_work.IndexedExample`
(`client_work.indexed_dataset_computation` builds them from client ids).
"""

import tensorflow_federated as tff

from tff_comp import registry
from tff_comp.algorithms import common
from tff_comp.learning_process import aggregation_factories
from tff_comp.ops import algorithm as algorithm_lib
from tff_comp.ops import client_round, model_ops, per_client, sgd, update_aggregation


@registry.register_algorithm('afl', home_task='imbalanced_digits')
def afl(
  model: tff.learning.models.FunctionalModel,
  *,
  num_clients: int,
  client_learning_rate: float,
  server_learning_rate: float = 1.0,
  lambda_learning_rate: float = 0.08,
  batch_size: int = 10,
  local_epochs: int = 1,
  server_optimizer: tff.learning.optimizers.Optimizer | None = None,
  model_aggregator: aggregation_factories.ModelAggregator | None = None,
) -> algorithm_lib.Algorithm:
  """Builds AFL over `num_clients` clients (the paper's lr_lambda: 0.08).

  Args:
    lambda_learning_rate: step size of the projected gradient ascent on the client
      weights lambda (the paper's lr_lambda: 0.08).
  """
  common.check_positive(
    client_learning_rate=client_learning_rate,
    lambda_learning_rate=lambda_learning_rate,
    num_clients=num_clients,
  )
  rule = per_client.AgnosticWeighted(
    sgd.SGD(model, learning_rate=client_learning_rate), num_clients=num_clients
  )
  server_rule = per_client.AgnosticServer(
    model_ops.trainable_specs(model),
    server_optimizer or common.server_sgd(server_learning_rate),
    num_clients=num_clients,
    lambda_learning_rate=lambda_learning_rate,
  )
  return common.algorithm(
    model,
    rule,
    server_rule,
    client_round.ClientOptions(batch_size, local_epochs, weighting='uniform'),
    aggregation_kind=update_aggregation.SLOTS,
    model_aggregator=model_aggregator,
  )


build_afl = common.process_builder(afl)
