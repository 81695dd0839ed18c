"""Model-agnostic meta-learning clients, pure TF: Per-FedAvg (Fallah, Mokhtari, Ozdaglar,
NeurIPS 2020) and Local-MOML (Wang, Yuan, Ying, Yang, JMLR 2023). Per-FedAvg's server
is FedAvg's (`sgd.OptimizerServer`); TR-MAML (`per_client.AgnosticWeighted` around
it) and the MAML objectives of ComFedL (`ops.objectives`) reuse the same adaptation
step, `model_ops.adapt`.

Per-FedAvg steps on f_i(w - alpha grad f_i(w)) with independent batches D, D', D'':

    w~ = w - alpha grad f(w; D);   g = grad f(w~; D')
    exact: w <- w - beta (g - alpha H(w; D'') g)     (Hessian-vector product by autodiff)
    fo:    w <- w - beta g                            (first order)
    hf:    H g replaced by (grad f(w + delta g; D'') - grad f(w - delta g; D'')) / (2 delta)

beta is the client learning rate.

Local-MOML steps on the same objective with a memory u_i of the client's adapted model,
on two batches a step (D_tr, D_val):

    v   = beta (w - alpha grad f(w; D_tr)) + (1 - beta) u
    exact: g = beta (I - alpha H(w; D_tr)) grad f(v; D_val)   (the gradient through v)
    fo:    g = grad f(v; D_val)                                (the authors' CIFAR code)
    u <- v (no gradient through it);  w <- w - eta g

eta is the client learning rate, beta the memory's weight. A memory that holds nothing
yet starts as w - alpha grad f(w; D_tr) of the first step (so v is that). Kept across
rounds (`memory='persistent'`, the paper's memory-based method): u_i lives in the
server state, one row per client, set when the client is sampled and left as it is
otherwise (`MemoryServer`). Re-set every round (`memory='round'`): as the authors'
federated code runs it. In the authors' code the memory starts from a batch D0 of its
own (K0 = 10 examples of tasks sampled afresh); with a client's fixed examples here it
starts from the first step's D_tr.
"""

import typing
from typing import Any, Literal, NamedTuple

import tensorflow as tf

from tff_comp.ops import compositional, messages, model_ops, per_client, server_steps
from tff_comp.ops import rule as rule_lib

# The Hessian-vector product variants (builders annotate their option with it).
Variant = Literal['exact', 'fo', 'hf']


# Why a MAML run diverges, most often.
DIVERGENCE_HINT = (
  'the meta-gradient (with the exact Hessian term especially) can be'
  ' several times the first-order one: try a smaller'
  ' --client_learning_rate (beta) or --alpha'
)


class PerFedAvg(rule_lib.ClientRule):
  """Per-FedAvg's client (see the module docstring). Payload: the broadcast
  ModelWeights. Its start loss is the post-adaptation loss L(w - alpha grad L(w; D); D)
  on all the client's examples (what TR-MAML's server ascends on)."""

  batches_per_step = 3
  VARIANTS = typing.get_args(Variant)

  def __init__(
    self, model, *, learning_rate: float, alpha: float, variant: str = 'fo', delta: float = 1e-3
  ):
    if variant not in self.VARIANTS:
      raise ValueError(f'variant={variant!r} is unknown; choose one of {self.VARIANTS}.')
    super().__init__(model, learning_rate=learning_rate)
    self._alpha, self._variant, self._delta = float(alpha), variant, float(delta)

  def initial_hparams(self):
    hparams = super().initial_hparams()
    hparams['alpha'] = self._alpha
    if self._variant == 'hf':
      hparams['delta'] = self._delta
    return hparams

  def start(self, payload):
    return tuple(payload.trainable), tuple(payload.non_trainable), ()

  def start_loss(self, payload, examples, hparams):
    trainable, non_trainable, _ = self.start(payload)
    _, adapted = model_ops.adapt(self.model, trainable, non_trainable, examples, hparams['alpha'])
    return model_ops.batch_loss(self.model, adapted, non_trainable, examples)

  def meta_gradient(self, weights, batches, hparams, non_trainable) -> tuple:
    """(loss on D at w, the variant's estimate of the gradient of f(w - alpha grad f(w)))."""
    d, d_prime, d_second = batches
    alpha = hparams['alpha']
    loss, adapted = model_ops.adapt(self.model, weights, non_trainable, d, alpha)
    _, outer = model_ops.batch_loss_and_gradient(self.model, adapted, non_trainable, d_prime)
    if self._variant == 'fo':
      return loss, outer
    if self._variant == 'exact':
      hv = model_ops.hessian_vector_product(self.model, weights, non_trainable, d_second, outer)
    else:
      hv = model_ops.finite_difference_hvp(
        self.model, weights, non_trainable, d_second, outer, hparams['delta']
      )
    return loss, tuple(g - alpha * h for g, h in zip(outer, hv))

  def local_step(self, weights, extras, batch, hparams, payload, context):
    del context
    _, non_trainable, _ = self.start(payload)
    loss, direction = self.meta_gradient(
      weights, compositional.split_batches(batch, 3), hparams, non_trainable
    )
    lr = hparams[rule_lib.LEARNING_RATE]
    return rule_lib.StepResult(loss, tuple(w - lr * d for w, d in zip(weights, direction)), extras)


# Where Local-MOML keeps each client's memory, and its meta-gradients.
Memory = Literal['persistent', 'round']
MomlVariant = Literal['exact', 'fo']


class MemoryExtras(NamedTuple):
  """Local-MOML's loop state besides the model: the memory u and whether it holds one."""

  memory: model_ops.Weights
  started: tf.Tensor  # float32: 1 once u holds a value


class LocalMoml(rule_lib.ClientRule):
  """Local-MOML's client (see the module docstring). hparams add alpha and beta.
  Payload: the broadcast ModelWeights (`memory='round'`) or MemoryPayload
  (`'persistent'`, the client's memory in row `client_index`); update: the
  pseudo-gradient, or a MemoryUpdate."""

  batches_per_step = 2
  VARIANTS = typing.get_args(MomlVariant)
  MEMORIES = typing.get_args(Memory)

  def __init__(
    self,
    model,
    *,
    learning_rate: float,
    alpha: float,
    beta: float,
    variant: str = 'fo',
    memory: str = 'persistent',
    num_clients: int | None = None,
  ):
    if variant not in self.VARIANTS:
      raise ValueError(f'variant={variant!r} is unknown; choose one of {self.VARIANTS}.')
    if memory not in self.MEMORIES:
      raise ValueError(f'memory={memory!r} is unknown; choose one of {self.MEMORIES}.')
    if memory == 'persistent' and not num_clients:
      raise ValueError("memory='persistent' keeps a row per client: give num_clients.")
    super().__init__(model, learning_rate=learning_rate)
    self._alpha, self._beta, self._variant = float(alpha), float(beta), variant
    self._persistent, self.num_clients = memory == 'persistent', num_clients

  @property
  def uses_client_index(self) -> bool:
    return self._persistent

  def initial_hparams(self):
    hparams = super().initial_hparams()
    hparams['alpha'], hparams['beta'] = self._alpha, self._beta
    return hparams

  def check_hparams(self, hparams) -> None:
    super().check_hparams(hparams)
    beta = float(hparams['beta'])
    if not 0.0 < beta <= 1.0:
      raise ValueError(f'beta must be in (0, 1], got {beta}.')

  def weights_of(self, payload):
    return payload.weights if self._persistent else payload

  def start(self, payload):
    weights = self.weights_of(payload)
    trainable = tuple(weights.trainable)
    return (
      trainable,
      tuple(weights.non_trainable),
      MemoryExtras(tuple(tf.zeros_like(w) for w in trainable), tf.constant(0.0)),
    )

  def initialize(self, payload, hparams, context):
    state = super().initialize(payload, hparams, context)
    if not self._persistent:
      return state
    # tf.gather, not table[i]: XLA would compile a slice at a tensor index per client.
    return state._replace(
      extras=MemoryExtras(
        tuple(tf.gather(table, context.client_index) for table in payload.memory),
        tf.gather(payload.seen, context.client_index),
      )
    )

  def local_step(self, weights, extras, batch, hparams, payload, context):
    del context
    _, non_trainable, _ = self.start(payload)
    d_tr, d_val = compositional.split_batches(batch, 2)
    alpha, beta = hparams['alpha'], hparams['beta']
    loss, adapted = model_ops.adapt(self.model, weights, non_trainable, d_tr, alpha)
    memory = tuple(tf.where(extras.started > 0, u, a) for u, a in zip(extras.memory, adapted))
    v = tuple(beta * a + (1.0 - beta) * u for a, u in zip(adapted, memory))
    _, outer = model_ops.batch_loss_and_gradient(self.model, v, non_trainable, d_val)
    if self._variant == 'exact':
      hv = model_ops.hessian_vector_product(self.model, weights, non_trainable, d_tr, outer)
      outer = tuple(beta * (g - alpha * h) for g, h in zip(outer, hv))
    lr = hparams[rule_lib.LEARNING_RATE]
    return rule_lib.StepResult(
      loss,
      tuple(w - lr * g for w, g in zip(weights, outer)),
      MemoryExtras(tuple(tf.stop_gradient(x) for x in v), tf.constant(1.0)),
    )

  def update(self, start, state, hparams, context):
    delta = super().update(start, state, hparams, context)
    if not self._persistent:
      return delta
    # A client that took no step (no examples) reports its memory as it was.
    return messages.MemoryUpdate(
      delta,
      tuple(per_client.slot(u, context, self.num_clients) for u in state.extras.memory),
      tf.one_hot(context.client_index, self.num_clients) * state.extras.started,
    )


class MemoryState(NamedTuple):
  """Local-MOML's server state with memory kept across rounds."""

  optimizer: Any  # the model optimizer's state
  memory: Any  # u_i: one table [num_clients, ...] per weight
  seen: Any  # [num_clients]: 1 where u_i was set

  # logged as the number of clients with memory (`server/seen`)
  counted = ('seen',)  # type: ignore[misc]
  client_state = ('memory', 'seen')  # type: ignore[misc]  # per-client tables (`ops.rule`)


class MemoryServer(rule_lib.ServerRule):
  """Local-MOML's server with memory kept across rounds: FedAvg's optimizer step on w,
  and the clients' memories, a row each, replaced where a client reported one (the
  others kept). Broadcasts MemoryPayload: every client receives the table and reads its
  row, as Ditto's personal models."""

  def __init__(self, specs, optimizer, *, num_clients: int):
    super().__init__(specs, optimizer)
    self.num_clients = num_clients

  def initialize(self):
    return MemoryState(
      self.optimizer_state(),
      tuple(tf.zeros([self.num_clients, *s.shape], s.dtype) for s in self.specs),
      tf.zeros([self.num_clients]),
    )

  def update_spec(self):
    return messages.MemoryUpdate(
      delta=self.specs,
      memory=tuple(tf.TensorSpec([self.num_clients, *s.shape], s.dtype) for s in self.specs),
      visited=tf.TensorSpec([self.num_clients], tf.float32),
    )

  def step(self, state, weights, update):
    opt_state, trainable = self.optimizer_step(state, weights.trainable, update.delta)
    memory = server_steps.replace_rows(tuple(state.memory), tuple(update.memory), update.visited)
    return rule_lib.ServerStepResult(
      MemoryState(opt_state, memory, tf.maximum(state.seen, update.visited)),
      rule_lib.with_trainable(weights, trainable),
    )

  def payload(self, state, weights):
    return messages.MemoryPayload(weights=weights, memory=state.memory, seen=state.seen)
