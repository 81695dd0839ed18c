"""The local-SGD family: FedAvg, FedProx and FedAvg-with-subgradients clients, FedNova's
normalized client, q-FFL's client, and their servers (pure TF).

    client (SGD):  v_{k+1} = rho v_k + g_k + mu (w_k - w_r) + s_k,   s_k in d psi(w_k)
                   w_{k+1} = w_k - eta_c v_{k+1}
    server (OptimizerServer): w_{r+1} = optimizer step from w_r along the mean
                   pseudo-gradient (SGD of rate eta_s: w_r + eta_s Delta)

rho = mu = 0 and no regularizer is FedAvg's client (McMahan et al. 2017); mu > 0
FedProx's (Li et al. 2020); rho > 0 heavy-ball momentum (reset every round); a
regularizer the naive composite baseline of Yuan et al. (2021).
"""

import tensorflow as tf

from tff_comp.ops import gradient_transforms, messages
from tff_comp.ops import regularizers as regularizers_lib
from tff_comp.ops import rule as rule_lib


class SGD(rule_lib.ClientRule):
  """Local SGD, w_{k+1} = w_k - eta_c d_k, the direction d_k the gradient through the
  rule's `transforms` (`ops.gradient_transforms`): by default the proximal term mu,
  the regularizer's subgradient when given, and momentum rho (see the module
  docstring); SCAFFOLD's client is this step with a control variate. Payload: the
  broadcast ModelWeights (`weights_of`). The transforms' hyperparameters (mu, rho) are
  the rule's, settable after building (0 disables a term)."""

  def __init__(
    self,
    model,
    *,
    learning_rate: float,
    proximal_strength: float = 0.0,
    momentum: float = 0.0,
    subgradient_of: regularizers_lib.Regularizer | None = None,
    transforms: tuple[gradient_transforms.Transform, ...] | None = None,
  ):
    super().__init__(model, learning_rate=learning_rate)
    self._subgradient_of = subgradient_of
    if transforms is None:
      subgradient = (
        () if subgradient_of is None else (gradient_transforms.Subgradient(subgradient_of),)
      )
      transforms = (
        gradient_transforms.Proximal(proximal_strength),
        *subgradient,
        gradient_transforms.Momentum(momentum),
      )
    self.transforms = tuple(transforms)

  def initial_hparams(self):
    hparams = super().initial_hparams()
    for transform in self.transforms:
      hparams.update(transform.hparams)
    return hparams

  def weights_of(self, payload):
    """The model weights the round starts from, in the payload."""
    return payload

  def start(self, payload):
    weights = self.weights_of(payload)
    trainable = tuple(weights.trainable)
    return (
      trainable,
      tuple(weights.non_trainable),
      gradient_transforms.init(self.transforms, trainable, payload),
    )

  def local_step(self, weights, extras, batch, hparams, payload, context):
    del context
    loss, grads = self.loss_and_gradient(weights, batch, payload)
    direction, extras = gradient_transforms.chain(
      self.transforms, grads, weights, extras, hparams, tuple(self.weights_of(payload).trainable)
    )
    lr = hparams[rule_lib.LEARNING_RATE]
    return rule_lib.StepResult(loss, tuple(w - lr * d for w, d in zip(weights, direction)), extras)

  def gradient_weight_norm(self, steps: tf.Tensor, hparams) -> tf.Tensor:
    """||a||_1 with Delta = -eta G a over `steps` local steps (FedNova, Wang et al.
    2020): tau for SGD; sum_k (1 - rho^(tau-k)) / (1 - rho) with momentum rho;
    sum_k (1 - eta mu)^(tau-1-k) with the proximal term mu."""
    if self._subgradient_of is not None:
      raise ValueError('FedNova is not defined with a regularizer subgradient.')
    tau = tf.cast(steps, tf.float32)
    rho, mu = hparams['momentum'], hparams['proximal_strength']
    with_momentum = tf.math.divide_no_nan(
      tau - rho * tf.math.divide_no_nan(1 - rho**tau, 1 - rho), 1 - rho
    )
    decay = 1 - hparams[rule_lib.LEARNING_RATE] * mu
    with_prox = tf.math.divide_no_nan(1 - decay**tau, 1 - decay)
    return tf.where(rho > 0, with_momentum, tf.where(mu > 0, with_prox, tau))


class NormalizedSGD(rule_lib.RuleWrapper):
  """FedNova's client: an SGD rule that also reports ||a_i||_1 of its steps
  (`messages.NormalizedUpdate`). The closed form of ||a||_1 covers SGD with momentum
  or with the proximal term, not both (`check_hparams`)."""

  def __init__(self, rule: SGD):
    super().__init__(rule)
    self.check_hparams(rule.initial_hparams())

  def check_hparams(self, hparams) -> None:
    super().check_hparams(hparams)
    if float(hparams['momentum']) > 0 and float(hparams['proximal_strength']) > 0:
      raise ValueError(
        'choose one local solver: client_momentum > 0 or mu > 0, not both'
        " (FedNova's ||a||_1 has a closed form for one of them)."
      )
    if not 0 <= float(hparams['momentum']) < 1:
      raise ValueError(f'client_momentum must be in [0, 1), got {float(hparams["momentum"])}.')

  def update(self, start, state, hparams, context):
    return messages.NormalizedUpdate(
      self.inner.update(start, state, hparams, context),
      self.inner.gradient_weight_norm(state.steps, hparams),
    )


class FairnessWeightedSGD(SGD):
  """q-FedAvg's client (Li, Sanjabi, Beirami, Smith, ICLR 2020).

  Local SGD from w gives w_local; with L = 1/eta_c, Dw = L (w - w_local) and F = the
  client's loss at w on all its examples (the context's start loss):

      Delta = F^q Dw,   h = q F^(q-1) ||Dw||^2 + L F^q

  The server (`RatioServer`) steps w <- w - sum Delta / sum h. q = 0 weighs clients
  equally (the server step is then the mean of Dw / L: FedAvg with uniform weights).
  """

  uses_start_loss = True

  def __init__(self, model, *, learning_rate: float, q: float):
    super().__init__(model, learning_rate=learning_rate)
    self._q = float(q)

  def initial_hparams(self):
    hparams = super().initial_hparams()
    hparams['q'] = self._q
    return hparams

  def update(self, start, state, hparams, context):
    lipschitz = 1.0 / hparams[rule_lib.LEARNING_RATE]
    dw = tuple(lipschitz * d for d in super().update(start, state, hparams, context))
    f, q = context.start_loss, hparams['q']
    norm_sq = tf.add_n([tf.reduce_sum(tf.square(d)) for d in dw])
    return messages.QUpdate(
      tuple(f**q * d for d in dw), q * f ** (q - 1) * norm_sq + lipschitz * f**q
    )


class OptimizerServer(rule_lib.ServerRule):
  """FedAvg's server: w_{r+1} = optimizer step from w_r with the mean update as
  gradient (TFF's `build_apply_optimizer_finalizer`); with SGD of rate eta_s it is
  w_{r+1} = w_r + eta_s Delta. Broadcasts the model."""

  def update_spec(self):
    return self.specs

  def step(self, state, weights, update):
    opt_state, trainable = self.optimizer_step(state, weights.trainable, update)
    return rule_lib.ServerStepResult(
      rule_lib.OptimizerState(opt_state), rule_lib.with_trainable(weights, trainable)
    )


class RatioServer(rule_lib.ServerRule):
  """q-FedAvg's server: w_{r+1} = w_r - sum_i Delta_i / sum_i h_i, from the uniform
  mean of `QUpdate(delta, h)`s (the ratio of means is the ratio of sums). Stateless."""

  def update_spec(self):
    return messages.QUpdate(delta=self.specs, h=tf.TensorSpec([], tf.float32))

  def step(self, state, weights, update):
    trainable = tuple(
      w - tf.math.divide_no_nan(d, update.h) for w, d in zip(weights.trainable, update.delta)
    )
    return rule_lib.ServerStepResult(state, rule_lib.with_trainable(weights, trainable))
