"""Local-MOML (Wang, Yuan, Ying, Yang, "Memory-Based Optimization Methods for
Model-Agnostic Meta-Learning and Personalized Federated Learning", JMLR 24(145), 2023):
MAML with a memory of each client's adapted model, local steps between rounds.

Objective: min_w (1/n) sum_i f_i(w - alpha grad f_i(w)). Each sampled client, from the
broadcast w and its memory u_i, takes `local_steps` steps (two batches each, D_tr and
D_val):

    v   = beta (w - alpha grad f_i(w; D_tr)) + (1 - beta) u_i
    w  <- w - eta g,  g = beta (I - alpha H_i(w; D_tr)) grad f_i(v; D_val)   (exact)
                      g = grad f_i(v; D_val)                                 (fo)
    u_i <- v

and the server takes the uniform mean of the clients' models. eta is the client
learning rate, beta the memory's weight (0.9 in the authors' code). The memory is kept
across rounds in the server state, a row per client, set when the client is sampled
(`memory='persistent'`, the paper's method), or re-set every round as the authors'
federated code does (`'round'`). A memory holding nothing yet starts as the first
step's w - alpha grad f_i(w; D_tr) (see `ops.maml`).

Example:
    algorithm = local_moml(model, num_clients=100, client_learning_rate=0.001)
    process = build_local_moml(model, num_clients=100, client_learning_rate=0.001)
"""

import tensorflow_federated as tff

from tff_comp import registry
from tff_comp.algorithms import common
from tff_comp.learning_process import aggregation_factories
from tff_comp.ops import algorithm as algorithm_lib
from tff_comp.ops import client_round, maml, model_ops, update_aggregation


@registry.register_algorithm(
  'local_moml', home_task='sinewave', divergence_hint=maml.DIVERGENCE_HINT
)
def local_moml(
  model: tff.learning.models.FunctionalModel,
  *,
  num_clients: int,
  client_learning_rate: float,
  alpha: float = 0.01,
  beta: float = 0.9,
  variant: maml.MomlVariant = 'fo',
  memory: maml.Memory = 'persistent',
  local_steps: int = 10,
  server_learning_rate: float = 1.0,
  batch_size: int = 5,
  client_weighting: str = 'uniform',
  server_optimizer: tff.learning.optimizers.Optimizer | None = None,
  model_aggregator: aggregation_factories.ModelAggregator | None = None,
) -> algorithm_lib.Algorithm:
  """Builds Local-MOML.

  Args:
    alpha: inner (adaptation) step size.
    beta: the memory's weight in v (1: no memory, a MAML step).
    variant: 'fo' (the first-order gradient at v, the authors' CIFAR code) or 'exact'
      (the gradient through v: a Hessian-vector product, their sinewave code).
    memory: 'persistent' (kept across rounds, a row per client) or 'round' (re-set
      every round).
    local_steps: steps per round, two batches each.
  """
  common.check_positive(
    client_learning_rate=client_learning_rate, alpha=alpha, num_clients=num_clients
  )
  rule = maml.LocalMoml(
    model,
    learning_rate=client_learning_rate,
    alpha=alpha,
    beta=beta,
    variant=variant,
    memory=memory,
    num_clients=num_clients,
  )
  rule.check_hparams(rule.initial_hparams())
  options = client_round.ClientOptions(
    batch_size, local_steps=local_steps, weighting=client_weighting
  )
  if memory == 'round':
    return common.fedavg_like(
      model,
      rule,
      options,
      server_learning_rate=server_learning_rate,
      server_optimizer=server_optimizer,
      model_aggregator=model_aggregator,
    )
  server_rule = maml.MemoryServer(
    model_ops.trainable_specs(model),
    server_optimizer or common.server_sgd(server_learning_rate),
    num_clients=num_clients,
  )
  return common.algorithm(
    model,
    rule,
    server_rule,
    options,
    aggregation_kind=update_aggregation.SLOTS,
    model_aggregator=model_aggregator,
  )


build_local_moml = common.process_builder(local_moml)
