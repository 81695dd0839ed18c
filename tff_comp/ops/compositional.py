"""Compositional federated learning, min (1/N) sum_i g_i(f_i(w)): the clients and
servers of ComFedL (Huang, Li) and Local-SCGDM (Gao, Li, Huang), pure TF.

ComFedL client, tau local steps with fresh batches B (inner) and B~ (outer):
    w <- w - eta_c grad g(f(w; B); B~)^T J f(w; B)         (one vector-Jacobian product)
server: FedAvg's (`sgd.OptimizerServer`).

Local-SCGDM client, tracker u of f and momentum m, step t:
    t = 0:  u = f(x; xi),  z = J f(x; xi)^T grad g(u; zeta),  m = z
    else:   u <- (1 - gamma eta) u + gamma eta f(x; xi)
            z = J f(x; xi)^T grad g(u; zeta),  m <- (1 - a eta) m + a eta z   (a: momentum_rate)
    x <- x - beta eta m
server (`TrackerServer`): averages x (through the optimizer), u and m, keeps them and
broadcasts them back. Objectives (DRFL, MAML, DA-MAML) are in `ops.objectives`.
"""

from typing import Any, NamedTuple

import tensorflow as tf

from tff_comp.ops import messages, model_ops
from tff_comp.ops import objectives as objectives_lib
from tff_comp.ops import rule as rule_lib


def split_batches(batch: Any, parts: int) -> tuple[Any, ...]:
  """A concatenation of `parts` batches split back into `parts` consecutive pieces; a
  short batch gives its first pieces one example more (ceil division)."""
  size = (model_ops.batch_size_of(batch) + parts - 1) // parts
  return tuple(
    tf.nest.map_structure(lambda t, i=i: t[i * size : (i + 1) * size], batch) for i in range(parts)
  )


class ObjectiveRule(rule_lib.ClientRule):
  """A client rule on a compositional objective g(f(w)): draws two batches per step
  when the outer function reads data, and takes the round's reference loss when the
  objective says it uses one (DRFL, DA-MAML)."""

  def __init__(
    self, model, *, learning_rate: float, objective: objectives_lib.CompositionalObjective
  ):
    super().__init__(model, learning_rate=learning_rate)
    self.objective = objective

  # Capability flags that depend on the objective.
  @property
  def batches_per_step(self) -> int:
    return 2 if self.objective.outer_uses_data else 1

  @property
  def uses_reference_loss(self) -> bool:
    return self.objective.uses_reference_loss

  def initial_hparams(self):
    hparams = super().initial_hparams()
    hparams.update(self.objective.hparams())
    return hparams

  def reference_value(self, payload, examples, hparams):
    trainable, non_trainable, _ = self.start(payload)
    return self.objective.reference_value(self.model, trainable, non_trainable, examples, hparams)

  def inner_and_outer_batches(self, batch: Any) -> tuple[Any, Any]:
    """(B, B~): the step's two halves, or the same batch twice when outer reads none."""
    if self.batches_per_step == 1:
      return batch, batch
    return split_batches(batch, 2)


class CompositionalSGD(ObjectiveRule):
  """ComFedL's client (see the module docstring). Payload: the broadcast ModelWeights."""

  def start(self, payload):
    return tuple(payload.trainable), tuple(payload.non_trainable), ()

  def local_step(self, weights, extras, batch, hparams, payload, context):
    _, non_trainable, _ = self.start(payload)
    inner_batch, outer_batch = self.inner_and_outer_batches(batch)
    g, inner_value, direction = objectives_lib.compositional_gradient(
      self.objective,
      self.model,
      weights,
      non_trainable,
      inner_batch,
      outer_batch,
      hparams,
      context.reference_loss,
    )
    lr = hparams[rule_lib.LEARNING_RATE]
    loss = self.objective.reported_loss(self.model, inner_value, outer_batch, g, hparams)
    return rule_lib.StepResult(loss, tuple(w - lr * d for w, d in zip(weights, direction)), extras)


class TrackerExtras(NamedTuple):
  """Local-SCGDM's loop state besides the iterate: tracker u, momentum m, and
  `started` (0 until the first step of training)."""

  u: Any
  m: model_ops.Weights
  started: tf.Tensor


class TrackedMomentum(ObjectiveRule):
  """Local-SCGDM's client (see the module docstring). t = 0 is the very first step of
  training (`started` = 0 in the payload); later rounds start from the server's
  averaged u and m, re-expressed in this round's reference (DRFL). `tracking_gamma` is
  the gamma above (not DRFL's gamma). Payload: TrackerPayload; update: TrackerUpdate."""

  def __init__(
    self,
    model,
    *,
    learning_rate: float,
    objective,
    momentum_rate: float,
    beta: float,
    tracking_gamma: float,
  ):
    super().__init__(model, learning_rate=learning_rate, objective=objective)
    self._momentum_rate, self._beta = float(momentum_rate), float(beta)
    self._tracking_gamma = float(tracking_gamma)

  def initial_hparams(self):
    hparams = super().initial_hparams()
    hparams.update(
      momentum_rate=self._momentum_rate, beta=self._beta, tracking_gamma=self._tracking_gamma
    )
    return hparams

  def check_hparams(self, hparams):
    for name in ('momentum_rate', 'tracking_gamma'):
      rate = float(hparams[name]) * float(hparams[rule_lib.LEARNING_RATE])
      if rate > 1:
        raise ValueError(
          f'{name} x client_learning_rate must be <= 1 (a convex combination), got {rate:g}.'
        )

  def start(self, payload):
    weights = payload.weights
    return (
      tuple(weights.trainable),
      tuple(weights.non_trainable),
      TrackerExtras(payload.u, tuple(payload.m), payload.started),
    )

  def initialize(self, payload, hparams, context):
    state = super().initialize(payload, hparams, context)
    m = self.objective.rescale_direction(
      state.extras.m, payload.reference_loss, context.reference_loss, hparams
    )
    return state._replace(extras=state.extras._replace(m=tuple(m)))

  def local_step(self, weights, extras, batch, hparams, payload, context):
    u, m, started = extras.u, extras.m, extras.started
    _, non_trainable, _ = self.start(payload)
    inner_batch, outer_batch = self.inner_and_outer_batches(batch)
    eta = hparams[rule_lib.LEARNING_RATE]
    reference = context.reference_loss
    with tf.GradientTape() as tape:
      tape.watch(weights)
      value = self.objective.inner(self.model, weights, non_trainable, inner_batch, hparams)
    first = tf.equal(started, 0.0)
    rate = hparams['tracking_gamma'] * eta
    u = tf.nest.map_structure(
      lambda old, new: tf.where(first, new, (1 - rate) * old + rate * new), u, value
    )
    with tf.GradientTape() as outer_tape:
      outer_tape.watch(u)
      g = self.objective.outer(self.model, u, outer_batch, hparams, reference)
    z = tuple(tape.gradient(value, weights, output_gradients=outer_tape.gradient(g, u)))
    momentum = hparams['momentum_rate'] * eta
    m = tuple(tf.where(first, zi, (1 - momentum) * mi + momentum * zi) for mi, zi in zip(m, z))
    new_weights = tuple(w - hparams['beta'] * eta * mi for w, mi in zip(weights, m))
    # The loss reported is the objective's at the current iterate (not at tracker u).
    loss = self.objective.reported_loss(
      self.model,
      value,
      outer_batch,
      self.objective.outer(self.model, value, outer_batch, hparams, reference),
      hparams,
    )
    return rule_lib.StepResult(loss, new_weights, TrackerExtras(u, m, tf.constant(1.0)))

  def update(self, start, state, hparams, context):
    return messages.TrackerUpdate(
      super().update(start, state, hparams, context),
      state.extras.u,
      state.extras.m,
      context.reference_loss,
    )


class TrackerState(NamedTuple):
  """Local-SCGDM's server state."""

  optimizer: Any  # the optimizer's state (its step on x)
  u: Any  # the tracker of the inner value (the objective's structure)
  m: Any  # the momentum (a tuple like the trainable weights)
  reference_loss: Any  # the reference loss m is expressed in (float32 scalar)
  started: Any  # 0.0 until the first round, then 1.0


class TrackerServer(rule_lib.ServerRule):
  """Local-SCGDM's server: x_{r+1} = optimizer step from x_r with the mean
  pseudo-gradient (SGD of rate 1: the mean of client models), u_{r+1} = mean_i u_i,
  m_{r+1} = mean_i m_i. State adds u, m, the reference loss m is expressed in, and
  `started` (0 until the first round). `tracker_spec`: TensorSpecs of u (the
  objective's inner value)."""

  def __init__(self, specs, optimizer, tracker_spec):
    super().__init__(specs, optimizer)
    self.tracker_spec = tracker_spec

  def _fresh(self, optimizer_state) -> TrackerState:
    return TrackerState(
      optimizer_state,
      u=tf.nest.map_structure(lambda s: tf.zeros(s.shape, s.dtype), self.tracker_spec),
      m=self.zeros(),
      reference_loss=tf.constant(0.0),
      started=tf.constant(0.0),
    )

  def initialize(self):
    return self._fresh(self.optimizer_state())

  def update_spec(self):
    return messages.TrackerUpdate(
      delta=self.specs,
      u=self.tracker_spec,
      m=self.specs,
      reference_loss=tf.TensorSpec([], tf.float32),
    )

  def step(self, state, weights, update):
    opt_state, trainable = self.optimizer_step(state, weights.trainable, update.delta)
    new_state = TrackerState(
      opt_state,
      u=update.u,
      m=tuple(update.m),
      reference_loss=update.reference_loss,
      started=tf.constant(1.0),
    )
    return rule_lib.ServerStepResult(new_state, rule_lib.with_trainable(weights, trainable))

  def payload(self, state, weights):
    return messages.TrackerPayload(
      weights=weights,
      u=state.u,
      m=state.m,
      reference_loss=state.reference_loss,
      started=state.started,
    )

  def reset(self, state, weights):
    del weights
    return self._fresh(state.optimizer)
