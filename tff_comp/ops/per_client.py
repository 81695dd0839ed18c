"""Rules with per-client server state, indexed by the client's position in the task
(pure TF): AFL (Mohri, Sivek, Suresh, ICML 2019), TR-MAML (Collins, Mokhtari,
Shakkottai, NeurIPS 2020) and Ditto (Li, Hu, Beirami, Smith, ICML 2021).

AFL / TR-MAML, min_w max_{lambda in simplex} sum_i lambda_i F_i(w):
    client i: its inner rule (local SGD for AFL, first-order Per-FedAvg for TR-MAML)
              from w, aggregated with weight lambda_i; reports its start loss F_i(w)
              (TR-MAML: the post-adaptation loss) in slot i of a [N] vector
    server:   w step on the lambda-weighted mean update, then
              projected (AFL):          lambda <- Proj_simplex(lambda + lr_lambda F)
              exponentiated (TR-MAML):  lambda <- lambda exp(lr_lambda F) / normalizer
Ditto, personal models v_i beside FedAvg's global w:
    client i: local SGD on w and, on the same batches,
              v_i <- v_i - eta_p (grad f_i(v_i; b) + lam (v_i - w_r))
    server:   FedAvg's step on w; row i of the personal table <- the returned v_i

Clients fill only their own slot (row) of the [N, ...] fields, so the sum over the
round's distinct clients is the round's table (`aggregation_factories.UpdateFactory`).
"""

import collections
from typing import Any, NamedTuple

import tensorflow as tf

from tff_comp.ops import messages, model_ops, server_steps
from tff_comp.ops import rule as rule_lib


def slot(value: tf.Tensor, context: rule_lib.RoundContext, num_clients: int) -> tf.Tensor:
  """`value` in row `client_index` of a [num_clients, *value.shape] table of zeros.

  A select, not `tf.scatter_nd`: the lanes engine vectorizes it across clients, where
  a scatter has no vectorized form (it ran as a loop over the cohort's clients)."""
  row = tf.reshape(
    tf.equal(tf.range(num_clients), context.client_index), [num_clients] + [1] * value.shape.rank
  )
  return tf.where(row, value[tf.newaxis], tf.zeros_like(value)[tf.newaxis])


class PerClientRule(rule_lib.RuleWrapper):
  """Wraps an inner rule whose payload is the `weights` field of this rule's payload,
  and writes per-client values into the client's own slot of [num_clients] tables."""

  uses_client_index = True

  def __init__(self, rule: rule_lib.ClientRule, *, num_clients: int):
    super().__init__(rule)
    self.num_clients = num_clients

  def payload_of(self, payload):
    return payload.weights

  def slot(self, value: tf.Tensor, context: rule_lib.RoundContext) -> tf.Tensor:
    return slot(value, context, self.num_clients)


class AgnosticWeighted(PerClientRule):
  """AFL's and TR-MAML's client: weight lambda_i from the payload, start loss in slot i.
  Payload: ClientWeightsPayload; update: SlotLossUpdate."""

  uses_start_loss = True
  weighs_clients = True

  def client_weight(self, payload, hparams, context):
    return tf.gather(payload.client_weights, context.client_index)

  def update(self, start, state, hparams, context):
    return messages.SlotLossUpdate(
      self.inner.update(start, state, hparams, context), self.slot(context.start_loss, context)
    )


class DittoExtras(NamedTuple):
  """Ditto's loop state besides the global iterate: the inner rule's extras and the
  client's personal model."""

  inner: Any
  personal: model_ops.Weights


class Ditto(PerClientRule):
  """Ditto's client around an SGD rule on the global model (see the module docstring).
  hparams add lam and, unless eta_p is tied to eta (`personal_learning_rate=None`, so
  setting the learning rate sets both), personal_learning_rate. Payload: DittoPayload
  (v_i is row i of its table); update: DittoUpdate."""

  def __init__(
    self,
    rule: rule_lib.ClientRule,
    *,
    num_clients: int,
    lam: float,
    personal_learning_rate: float | None = None,
  ):
    super().__init__(rule, num_clients=num_clients)
    self._personal_learning_rate, self._lam = personal_learning_rate, float(lam)

  def initial_hparams(self):
    hparams = super().initial_hparams()
    if self._personal_learning_rate is not None:
      hparams['personal_learning_rate'] = float(self._personal_learning_rate)
    hparams['lam'] = self._lam
    return hparams

  def initialize(self, payload, hparams, context):
    state = super().initialize(payload, hparams, context)
    # tf.gather, not table[i]: XLA (the lanes engine) would compile a slice at a
    # tensor index as a constant, once per client.
    personal = tuple(tf.gather(table, context.client_index) for table in payload.personal)
    return state._replace(extras=DittoExtras(state.extras, personal))

  def local_step(self, weights, extras, batch, hparams, payload, context):
    inner_extras, personal = extras.inner, extras.personal
    loss, weights, inner_extras = super().local_step(
      weights, inner_extras, batch, hparams, payload, context
    )
    _, grads = self.loss_and_gradient(personal, batch, payload)
    lr = hparams.get('personal_learning_rate', hparams[rule_lib.LEARNING_RATE])
    lam = hparams['lam']
    personal = tuple(
      v - lr * (g + lam * (v - w0)) for v, g, w0 in zip(personal, grads, payload.weights.trainable)
    )
    return rule_lib.StepResult(loss, weights, DittoExtras(inner_extras, personal))

  def update(self, start, state, hparams, context):
    personal = state.extras.personal
    inner_state = state._replace(extras=state.extras.inner)
    return messages.DittoUpdate(
      self.inner.update(start, inner_state, hparams, context),
      tuple(self.slot(v, context) for v in personal),
      tf.one_hot(context.client_index, self.num_clients),
    )


class AgnosticState(NamedTuple):
  """AFL's and TR-MAML's server state."""

  optimizer: Any  # the model optimizer's state
  client_weights: Any  # lambda, one weight per client (float32 [num_clients])
  lambda_learning_rate: Any  # its step size, a hyperparameter (float32 scalar)


class AgnosticServer(rule_lib.ServerRule):
  """AFL's (projected) and TR-MAML's (exponentiated) server; see the module docstring.
  State adds the client weights lambda (uniform at the start) and their learning rate,
  a hyperparameter (`lambda_learning_rate`) beside the optimizer's. Broadcasts
  ClientWeightsPayload."""

  ASCENTS = ('projected', 'exponentiated')

  def __init__(
    self,
    specs,
    optimizer,
    *,
    num_clients: int,
    lambda_learning_rate: float,
    ascent: str = 'projected',
  ):
    if ascent not in self.ASCENTS:
      raise ValueError(f'ascent={ascent!r} must be one of {self.ASCENTS}.')
    super().__init__(specs, optimizer)
    self.num_clients, self.ascent = num_clients, ascent
    self.lambda_learning_rate = lambda_learning_rate

  def _uniform(self):
    return tf.fill([self.num_clients], 1.0 / self.num_clients)

  def initialize(self):
    return AgnosticState(
      self.optimizer_state(), self._uniform(), tf.constant(self.lambda_learning_rate, tf.float32)
    )

  def get_hparams(self, state):
    hparams = super().get_hparams(state)
    hparams['lambda_learning_rate'] = state.lambda_learning_rate
    return hparams

  def set_hparams(self, state, hparams):
    hparams = collections.OrderedDict(hparams)
    rate = tf.cast(hparams.pop('lambda_learning_rate'), tf.float32)
    return super().set_hparams(state._replace(lambda_learning_rate=rate), hparams)

  def update_spec(self):
    return messages.SlotLossUpdate(
      delta=self.specs, losses=tf.TensorSpec([self.num_clients], tf.float32)
    )

  def step(self, state, weights, update):
    opt_state, trainable = self.optimizer_step(state, weights.trainable, update.delta)
    rate = state.lambda_learning_rate
    if self.ascent == 'projected':
      lam = server_steps.project_simplex(state.client_weights + rate * update.losses)
    else:
      lam = server_steps.exponentiated_gradient_step(state.client_weights, update.losses, rate)
    new_state = state._replace(optimizer=opt_state, client_weights=lam)
    return rule_lib.ServerStepResult(new_state, rule_lib.with_trainable(weights, trainable))

  def payload(self, state, weights):
    return messages.ClientWeightsPayload(weights=weights, client_weights=state.client_weights)

  def reset(self, state, weights):
    del weights
    return state._replace(client_weights=self._uniform())


class PersonalState(NamedTuple):
  """Ditto's server state."""

  optimizer: Any  # the global model optimizer's state
  personal: Any  # the personal models: one table [num_clients, ...] per weight

  client_state = ('personal',)  # type: ignore[misc]  # per-client tables (`ops.rule`)


class PersonalModelsServer(rule_lib.ServerRule):
  """Ditto's server: FedAvg's optimizer step on w and the table of personal models
  (every row starts at the initial model via `reset`; a visited row is replaced).
  Broadcasts DittoPayload(weights, table): every client receives the whole table
  (num_clients x model size) and reads its row, which is simple and cheap for
  simulations of up to hundreds of small models (`tff.federated_select` would send
  each client its row only)."""

  keeps_personal_models = True

  def __init__(self, specs, optimizer, *, num_clients: int):
    super().__init__(specs, optimizer)
    self.num_clients = num_clients

  def _tile(self, trainable):
    return tuple(tf.tile(w[tf.newaxis], [self.num_clients] + [1] * w.shape.rank) for w in trainable)

  def initialize(self):
    return PersonalState(self.optimizer_state(), self._tile(self.zeros()))

  def update_spec(self):
    return messages.DittoUpdate(
      delta=self.specs,
      personal=tuple(tf.TensorSpec([self.num_clients, *s.shape], s.dtype) for s in self.specs),
      visited=tf.TensorSpec([self.num_clients], tf.float32),
    )

  def step(self, state, weights, update):
    opt_state, trainable = self.optimizer_step(state, weights.trainable, update.delta)
    personal = server_steps.replace_rows(
      tuple(state.personal), tuple(update.personal), update.visited
    )
    return rule_lib.ServerStepResult(
      PersonalState(opt_state, personal), rule_lib.with_trainable(weights, trainable)
    )

  def payload(self, state, weights):
    return messages.DittoPayload(weights=weights, personal=state.personal)

  def reset(self, state, weights):
    return PersonalState(state.optimizer, self._tile(tuple(weights.trainable)))

  def personal_weights(self, state):
    return state.personal
