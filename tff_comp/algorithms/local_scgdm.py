"""Local-SCGDM: local stochastic compositional gradient descent with momentum
(Gao, Li, Huang).

Every client keeps x, an inner-value tracker u and a momentum m; a local step t is

    t = 0:  u = f(x; xi),  z = J f(x; xi)^T grad g(u; zeta),  m = z
    else:   u <- (1 - gamma eta) u + gamma eta f(x; xi)
            z = J f(x; xi)^T grad g(u; zeta);  m <- (1 - a eta) m + a eta z
    x <- x - beta eta m

and every p steps (one round: `local_steps` = p) the server averages x, u and m, which
it keeps as state and broadcasts back. Theory: eta = T^(-1/2), p = T^(1/4).
Here eta is `client_learning_rate`, a is `momentum_rate` (the paper's alpha, renamed so
that `--alpha` means one thing: MAML's inner step) and gamma is `tracking_gamma`; DRFL's
own gamma is `gamma`. With DRFL, m is rescaled exactly when the round's reference loss moves
(see ops.objectives.DRFL).
"""

import tensorflow_federated as tff

from tff_comp import registry
from tff_comp.algorithms import common
from tff_comp.learning_process import aggregation_factories
from tff_comp.ops import algorithm as algorithm_lib
from tff_comp.ops import client_round, compositional, model_ops, objectives


@registry.register_algorithm(
  'local_scgdm', home_task='imbalanced_digits', divergence_hint=objectives.DIVERGENCE_HINT
)
def local_scgdm(
  model: tff.learning.models.FunctionalModel,
  *,
  client_learning_rate: float,
  momentum_rate: float = 1.0,
  beta: float = 1.0,
  tracking_gamma: float = 1.0,
  objective: objectives.ObjectiveName = 'drfl',
  gamma: float = 0.2,
  inner_learning_rate: float = 0.05,
  local_steps: int = 5,
  batch_size: int = 10,
  client_weighting: str = 'uniform',
  model_aggregator: aggregation_factories.ModelAggregator | None = None,
) -> algorithm_lib.Algorithm:
  """Builds Local-SCGDM with period `local_steps` (p).

  Args:
    momentum_rate: momentum rate a (the paper's alpha): m <- (1 - a eta) m + a eta z.
    beta: step factor of the model update: x <- x - beta eta m.
    tracking_gamma: rate of the inner-value tracker: u <- (1 - gamma eta) u + gamma eta
      f(x).
    objective: 'drfl', 'maml' or 'da_maml', as for comfedl.
    gamma: temperature of DRFL's exp(F/gamma) and DA-MAML's exp(L/gamma).
    inner_learning_rate: inner adaptation step alpha of the 'maml' and 'da_maml'
      objectives.
    local_steps: local steps between the server's averages of x, u and m (the period p).
  """
  common.check_positive(
    client_learning_rate=client_learning_rate,
    momentum_rate=momentum_rate,
    beta=beta,
    tracking_gamma=tracking_gamma,
  )
  obj = objectives.make_objective(objective, gamma=gamma, inner_learning_rate=inner_learning_rate)
  rule = compositional.TrackedMomentum(
    model,
    learning_rate=client_learning_rate,
    objective=obj,
    momentum_rate=momentum_rate,
    beta=beta,
    tracking_gamma=tracking_gamma,
  )
  rule.check_hparams(rule.initial_hparams())
  server_rule = compositional.TrackerServer(
    model_ops.trainable_specs(model), common.server_sgd(1.0), obj.value_spec(model)
  )
  return common.algorithm(
    model,
    rule,
    server_rule,
    client_round.ClientOptions(batch_size, local_steps=local_steps, weighting=client_weighting),
    model_aggregator=model_aggregator,
  )


build_local_scgdm = common.process_builder(local_scgdm)
