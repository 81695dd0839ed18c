"""TR-MAML: task-robust MAML (Collins, Mokhtari, Shakkottai, NeurIPS 2020), a baseline
of the ComFedL paper's DA-MAML experiment.

    min_w max_{p in simplex} sum_i p_i L_i(w - alpha grad L_i(w))

Clients take first-order MAML steps (as Per-FedAvg `fo`); the server applies the
p-weighted mean update and ascends on p by exponentiated gradient on the clients'
post-adaptation losses. p is per client, so clients receive IndexedExamples (as AFL).
"""

import tensorflow_federated as tff

from tff_comp import aggregators
from tff_comp import client_work
from tff_comp import registry
from tff_comp import server_updates
from tff_comp.algorithms import common
from tff_comp.ops import client_updates


@registry.register_algorithm('tr_maml')
def build_tr_maml(
    model: tff.learning.models.FunctionalModel,
    *,
    num_clients: int,
    client_learning_rate: float,
    alpha: float = 0.01,
    task_weight_learning_rate: float = 0.1,
    local_steps: int = 10,
    server_learning_rate: float = 1.0,
    batch_size: int = 5,
) -> tff.learning.templates.LearningProcess:
  """Builds TR-MAML; `task_weight_learning_rate` is the exponentiated-gradient step."""
  common.check_positive(client_learning_rate=client_learning_rate, alpha=alpha,
                        task_weight_learning_rate=task_weight_learning_rate)
  rule = client_updates.TaskRobustMAML(
      model, num_clients=num_clients, learning_rate=client_learning_rate, alpha=alpha,
      variant='fo')
  server_update = server_updates.build_agnostic_update(
      common.server_sgd(server_learning_rate, 0.0), client_work.model_weights_type(model),
      num_clients, task_weight_learning_rate, ascent='exponentiated')
  return common.compose(model, rule, server_update, batch_size=batch_size, local_epochs=1,
                        local_steps=local_steps, client_weighting='uniform',
                        aggregator=aggregators.PerClientSlotsFactory())
