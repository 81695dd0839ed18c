"""Federated composite optimization, min F(w) + psi(w) (Yuan, Zaheer, Reddi, ICML 2021):
the clients and servers of FedMiD and FedDualAvg, and their -OSP variants (pure TF).

FedMiD (federated mirror descent):
    client: w_{k+1} = prox_{eta_c psi}(w_k - eta_c g_k)       (OSP: no client prox)
    server: w_{r+1} = prox_{eta_s mean(sum eta_c) psi}(w_r + eta_s Delta)
FedDualAvg (federated dual averaging), server state z (z_0 = w_0), c (c_0 = 0):
    client: w_k = prox_{(c_r + e_k) psi}(z_k),  e_k = the client's sum of eta_c so far
            z_{k+1} = z_k - eta_c grad f(w_k; batch)         (OSP: w_k = z_k)
    server: z_{r+1} = z_r + eta_s Delta;  c_{r+1} = c_r + eta_s mean(sum eta_c)
            w_{r+1} = prox_{c_{r+1} psi}(z_{r+1})
Clients report `ElapsedUpdate(start - end, sum eta_c)`; "eta_c K" of the paper is
generalized to the clients' mean sum of eta_c, so unequal step counts stay exact.
"""

from typing import Any, NamedTuple

import tensorflow as tf

from tff_comp.ops import messages, server_steps
from tff_comp.ops import regularizers as regularizers_lib
from tff_comp.ops import rule as rule_lib


class CompositeRule(rule_lib.ClientRule):
  """A client rule for F + psi: holds psi and whether clients apply its prox; reports
  an `ElapsedUpdate` (its extras are the elapsed sum of eta_c)."""

  def __init__(
    self,
    model,
    *,
    learning_rate: float,
    regularizer: regularizers_lib.Regularizer,
    client_prox: bool = True,
  ):
    super().__init__(model, learning_rate=learning_rate)
    self._regularizer = regularizer
    self._client_prox = client_prox

  def update(self, start, state, hparams, context):
    return messages.ElapsedUpdate(super().update(start, state, hparams, context), state.extras)


class ProximalSGD(CompositeRule):
  """FedMiD's client: prox after each SGD step (plain SGD with client_prox=False).
  Payload: the broadcast ModelWeights."""

  def start(self, payload):
    return tuple(payload.trainable), tuple(payload.non_trainable), tf.constant(0.0)

  def local_step(self, weights, lr_sum, batch, hparams, payload, context):
    del context
    lr = hparams[rule_lib.LEARNING_RATE]
    loss, grads = self.loss_and_gradient(weights, batch, payload)
    weights = tuple(w - lr * g for w, g in zip(weights, grads))
    if self._client_prox:
      weights = self._regularizer.prox(weights, lr)
    return rule_lib.StepResult(loss, weights, lr_sum + lr)


class DualAveraging(CompositeRule):
  """FedDualAvg's client: steps on the dual, gradients at the prox of the dual with
  the elapsed coefficient (at the dual itself with client_prox=False). Reports the
  dual pseudo-gradient. Payload: DualPayload."""

  def start(self, payload):
    dual = payload.dual
    return tuple(dual.trainable), tuple(dual.non_trainable), tf.constant(0.0)

  def primal(self, dual: rule_lib.Weights, elapsed: tf.Tensor) -> rule_lib.Weights:
    if not self._client_prox:
      return dual
    return self._regularizer.prox(dual, elapsed)

  def local_step(self, dual, lr_sum, batch, hparams, payload, context):
    del context
    lr = hparams[rule_lib.LEARNING_RATE]
    primal = self.primal(dual, payload.elapsed + lr_sum)
    loss, grads = self.loss_and_gradient(primal, batch, payload)
    return rule_lib.StepResult(loss, tuple(z - lr * g for z, g in zip(dual, grads)), lr_sum + lr)


class _CompositeServer(rule_lib.ServerRule):
  """A server rule with a regularizer, taking ElapsedUpdates."""

  def __init__(self, specs, optimizer, regularizer: regularizers_lib.Regularizer):
    super().__init__(specs, optimizer)
    self.regularizer = regularizer

  def update_spec(self):
    return messages.ElapsedUpdate(delta=self.specs, lr_sum=tf.TensorSpec([], tf.float32))


class MirrorDescentServer(_CompositeServer):
  """FedMiD's server: w_{r+1} = prox_{eta_s mean(sum eta_c) psi}(w_r + eta_s Delta);
  the optimizer makes the step w_r + eta_s Delta (SGD in the paper). Broadcasts the
  model."""

  def step(self, state, weights, update):
    opt_state, trainable = self.optimizer_step(state, weights.trainable, update.delta)
    trainable = server_steps.mirror_descent_server_step(
      trainable, self.regularizer, self.learning_rate(opt_state), update.lr_sum
    )
    return rule_lib.ServerStepResult(
      rule_lib.OptimizerState(opt_state), rule_lib.with_trainable(weights, trainable)
    )


class DualState(NamedTuple):
  """FedDualAvg's server state."""

  optimizer: Any  # the optimizer's state (its step is the dual step)
  dual: Any  # z, the dual state (a tuple like the trainable weights)
  elapsed: Any  # c, the elapsed coefficient (float32 scalar)


class DualAveragingServer(_CompositeServer):
  """FedDualAvg's server: dual step z_{r+1} = z_r + eta_s Delta (the optimizer's),
  c_{r+1} = c_r + eta_s mean(sum eta_c), primal w_{r+1} = prox_{c_{r+1} psi}(z_{r+1}).
  State: optimizer state, dual z, elapsed c. Broadcasts DualPayload(z, c); the model
  it returns is the primal w."""

  def initialize(self):
    return DualState(self.optimizer_state(), self.zeros(), tf.constant(0.0))

  def step(self, state, weights, update):
    opt_state, dual = self.optimizer_step(state, state.dual, update.delta)
    trainable, elapsed = server_steps.dual_averaging_server_step(
      dual, state.elapsed, self.regularizer, self.learning_rate(opt_state), update.lr_sum
    )
    return rule_lib.ServerStepResult(
      DualState(opt_state, dual, elapsed), rule_lib.with_trainable(weights, trainable)
    )

  def payload(self, state, weights):
    return messages.DualPayload(
      dual=rule_lib.with_trainable(weights, state.dual), elapsed=state.elapsed
    )

  def reset(self, state, weights):
    return DualState(state.optimizer, tuple(weights.trainable), tf.constant(0.0))
