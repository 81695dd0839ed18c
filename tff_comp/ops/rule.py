"""The two halves of every algorithm's math: a client rule and a server rule (pure TF).

Writing a client rule (subclass `ClientRule`)
---------------------------------------------
Implement two hooks; override the optional ones only where the math needs it:

    start(payload) -> (trainable start, non-trainable, extras)       required
    local_step(weights, extras, batch, hparams, payload, context)
        -> (batch loss, new weights, new extras)                     required
    update(start, final LocalState, hparams, context) -> U           default start - end
    client_weight(payload, hparams, context) -> weight or None       default None (n_i or 1)
    initial_hparams() / check_hparams(hparams)                        learning_rate; checks
    start_loss / reference_value(payload, examples, hparams)         with the flags below

`extras` is the rule's own per-client loop state: a named structure of tensors with
fixed shapes (a NamedTuple, or local SGD's transform states by name:
`ops.gradient_transforms`), never a positional tuple.
`initialize`, `step` and `finalize` are what runtimes call (`ops.client_round`); a rule
does not override them unless it adds loop state from the payload (Ditto's personal
model). Capability flags (`CAPABILITIES`) are read-only properties of `ClientRule`; a
rule sets its own as class attributes (`batches_per_step = 2`), or as properties where
they depend on its arguments, and `RuleWrapper` forwards them all.

The fast engines run `local_step` in lockstep lanes (`tf.vectorized_map` under XLA,
`runtime.inprocess.lanes`): keep it vectorizable, with static shapes; read a row of a table with
`tf.gather(table, index)`, never `table[index]` at a tensor index (XLA compiles a slice
at a tensor index as a constant, once per client); a step that runs a decomposition
(SVD, QR, eig, solves) runs on the mapped engine instead
(`runtime.inprocess` chooses and says why).

The runtime's view
------------------
A client rule says what one client computes from the broadcast payload P and its
batches; `ops.client_round.run_client` runs it (any runtime calls that function):

    state  = rule.initialize(payload, hparams, context)
    state  = rule.step(state, batch, payload, hparams, context)     # once per local step
    update = rule.finalize(state, payload, hparams, context)
    weight = rule.client_weight(payload, hparams, context)          # None: the runtime's

A server rule holds the server state S and says what clients receive; implement
`update_spec` and `step`, optionally `payload`, `reset`, `initialize`:

    S  = rule.initialize()              S' = rule.reset(S, W)   (restart at weights W)
    P  = rule.payload(S, W)             (S', W') = rule.step(S, W, U)

S is a NamedTuple of the rule's own (`OptimizerState` when the optimizer's state is all
it keeps), its first field the optimizer's state: a reader finds `state.dual`, not a
string key, and the state's structure (what TFF types and checkpoints store) is the
class. U being the aggregated client update. `hparams` are OrderedDicts of float tensors the
runtime keeps in its state (so learning rates can be read and set between rounds);
`context` is a `RoundContext`: per-round facts that are not hyperparameters. Updates
follow TFF's sign convention: a client reports the pseudo-gradient `start - end`
(= -Delta, Delta being the model change the papers write), so a server optimizer applies
it as a gradient.

Per-client tables (SCAFFOLD's c_i, Ditto's personal models, Local-MOML's memory) are
fields of S, [num_clients, ...] each, that S's type names in `client_state`; the
payload passes each on in its field of the same name, where client i reads row i only
(`client_rows` on the payload's type; such class constants of a NamedTuple carry
`# type: ignore[misc]`, as mypy allows only fields in its body). `step` must give the
same results when those tables and the update's per-client slots hold only the round's
clients' rows, in any order: it reads and writes a table only at the rows the slots
mark visited (the others pass through, or add exact zeros). A runtime that keeps the
tables with the clients (`runtime.ray`) then runs `step` on the round's rows alone.
Weights on a simplex (AFL's lambda) are projected whole: server state, not client
state.

Nothing here imports TFF: weights are any NamedTuple with `trainable`
and `non_trainable` (TFF's ModelWeights in the TFF layer), optimizers anything with
TFF's functional-optimizer interface (`initialize`, `next`, `get_hparams`, `set_hparams`).
"""

import abc
import collections
from typing import Any, NamedTuple

import tensorflow as tf

from tff_comp.ops import model_ops

Weights = model_ops.Weights
LEARNING_RATE = 'learning_rate'


class RoundContext(NamedTuple):
  """What a client knows of the round besides hyperparameters.

  client_index: int32 position of the client in the task's client list (rules with
    per-client server state: AFL, TR-MAML, Ditto); -1 where the runtime has none.
  reference_loss: float32, the round's common reference (the largest loss of the
    round's clients at the broadcast model) for rules with `uses_reference_loss`.
  start_loss: float32, the client's own loss at the broadcast model on all its
    examples, for rules with `uses_start_loss` (filled in by `run_client`).
  """

  client_index: tf.Tensor
  reference_loss: tf.Tensor
  start_loss: tf.Tensor

  @classmethod
  def of(cls, client_index=-1, reference_loss=0.0, start_loss=0.0) -> 'RoundContext':
    return cls(
      tf.cast(client_index, tf.int32),
      tf.cast(reference_loss, tf.float32),
      tf.cast(start_loss, tf.float32),
    )


class StepResult(NamedTuple):
  """What a client rule's `local_step` returns."""

  loss: tf.Tensor  # the batch's mean loss at the weights before the step
  weights: Weights  # the trained weights after it
  extras: Any  # the rule's extras after it


class OptimizerState(NamedTuple):
  """The state of a server rule that keeps only its optimizer's (FedAvg's)."""

  optimizer: Any = ()  # the server optimizer's state; () for a rule without one


class ServerStepResult(NamedTuple):
  """What a server rule's `step` returns."""

  state: Any  # the server rule's new state (its NamedTuple)
  weights: Any  # the new model weights (ModelWeights-like)


class LocalState(NamedTuple):
  """Loop state of every client rule: the iterate, rule extras, loss bookkeeping."""

  weights: Weights  # the trainable weights being trained (dual state for DA)
  extras: Any  # rule-specific tensors (e.g. elapsed step sizes)
  loss_sum: tf.Tensor  # sum over steps of batch loss x batch size
  examples: tf.Tensor  # examples processed
  steps: tf.Tensor  # local steps taken


# The capability flags of a client rule (properties a rule overrides; see ClientRule).
CAPABILITIES = (
  'batches_per_step',
  'weighs_clients',
  'uses_reference_loss',
  'uses_start_loss',
  'uses_client_index',
)


class ClientRule(abc.ABC):
  """Local update rule on a FunctionalModel; see the module docstring.

  Capability flags (`CAPABILITIES`): `batches_per_step`: a step receives this many
  batches concatenated (compositional and MAML rules draw separate batches).
  `uses_reference_loss`: the runtime computes, before local training, the round's
  reference (`reference_value` maximized over the round's clients) and passes it in the
  context. `uses_start_loss`: `run_client` passes the client's own `start_loss` in the
  context. `uses_client_index`: the runtime must tell the client its index.
  `weighs_clients`: `client_weight` gives the rule's own aggregation weights (AFL's
  lambda), not the runtime's.
  """

  # Read-only here; a rule overrides a flag with a class attribute (`batches_per_step =
  # 2`) or a property of its own (a wrapper's, forwarded to its inner rule).
  @property
  def batches_per_step(self) -> int:
    return 1

  @property
  def weighs_clients(self) -> bool:  # client_weight returns the rule's own weights
    return False

  @property
  def uses_reference_loss(self) -> bool:
    return False

  @property
  def uses_start_loss(self) -> bool:
    return False

  @property
  def uses_client_index(self) -> bool:
    return False

  def __init__(self, model, *, learning_rate: float):
    self.model = model
    self._learning_rate = float(learning_rate)

  def initial_hparams(self) -> collections.OrderedDict:
    """The rule's hyperparameters, stored as float32 by the runtime."""
    return collections.OrderedDict(learning_rate=self._learning_rate)

  def check_hparams(self, hparams) -> None:
    """Raises ValueError for hyperparameter values (floats) the rule's math does not
    allow: the rule's invariants live here, so values set later cannot break them.
    Builders check the initial ones; tff_comp's runtimes check values set later."""
    del hparams

  @abc.abstractmethod
  def start(self, payload) -> tuple[Weights, Weights, Any]:
    """(trainable start point, non-trainable weights, extras) from the payload."""

  @abc.abstractmethod
  def local_step(
    self, weights: Weights, extras: Any, batch: Any, hparams, payload, context: RoundContext
  ) -> StepResult:
    """One step on `batch`: (batch loss, new weights, new extras)."""

  def loss_and_gradient(self, weights: Weights, batch: Any, payload):
    """The model's loss on `batch` at `weights` and its gradient."""
    _, non_trainable, _ = self.start(payload)
    return model_ops.batch_loss_and_gradient(self.model, weights, non_trainable, batch)

  def update(self, start: Weights, state: LocalState, hparams, context: RoundContext) -> Any:
    """The update sent for aggregation; default: the pseudo-gradient start - end."""
    del hparams, context
    return tuple(a - b for a, b in zip(start, state.weights))

  def start_loss(self, payload, examples, hparams) -> tf.Tensor:
    """The client's loss at the broadcast model on all its examples (uses_start_loss)."""
    del hparams
    trainable, non_trainable, _ = self.start(payload)
    return model_ops.batch_loss(self.model, trainable, non_trainable, examples)

  def reference_value(self, payload, examples, hparams) -> tf.Tensor:
    """This client's candidate for the round's reference loss (uses_reference_loss)."""
    return self.start_loss(payload, examples, hparams)

  def client_weight(self, payload, hparams, context: RoundContext) -> tf.Tensor | None:
    """This client's aggregation weight, or None for the runtime's weighting."""
    del payload, hparams, context
    return None

  # --- called by runtimes (ops.client_round); rules rarely override these ---------

  def initialize(self, payload, hparams, context: RoundContext) -> LocalState:
    del hparams, context
    trainable, _, extras = self.start(payload)
    return LocalState(
      tuple(trainable), extras, tf.constant(0.0), tf.constant(0, tf.int32), tf.constant(0, tf.int32)
    )

  def step(self, state: LocalState, batch, payload, hparams, context: RoundContext) -> LocalState:
    loss, weights, extras = self.local_step(
      state.weights, state.extras, batch, hparams, payload, context
    )
    size = model_ops.batch_size_of(batch)
    return LocalState(
      weights,
      extras,
      state.loss_sum + loss * tf.cast(size, tf.float32),
      state.examples + size,
      state.steps + 1,
    )

  def finalize(self, state: LocalState, payload, hparams, context: RoundContext) -> Any:
    trainable, _, _ = self.start(payload)
    return self.update(tuple(trainable), state, hparams, context)


class RuleWrapper(ClientRule):
  """A client rule around an inner rule: every hook and capability flag forwards to
  `inner` unless the wrapper overrides it (FedNova's normalized client, the per-client
  rules). `payload_of(payload)` is what the inner rule receives (default: the same
  payload); a wrapper whose payload carries more (AFL's client weights) overrides it."""

  def __init__(self, inner: ClientRule):
    # No learning rate of its own: hyperparameters are the inner rule's.
    self.inner = inner
    self.model = inner.model

  @property
  def batches_per_step(self) -> int:
    return self.inner.batches_per_step

  @property
  def weighs_clients(self) -> bool:
    return self.inner.weighs_clients

  @property
  def uses_reference_loss(self) -> bool:
    return self.inner.uses_reference_loss

  @property
  def uses_start_loss(self) -> bool:
    return self.inner.uses_start_loss

  @property
  def uses_client_index(self) -> bool:
    return self.inner.uses_client_index

  def payload_of(self, payload):
    return payload

  def initial_hparams(self):
    return self.inner.initial_hparams()

  def check_hparams(self, hparams) -> None:
    self.inner.check_hparams(hparams)

  def start(self, payload):
    return self.inner.start(self.payload_of(payload))

  def local_step(self, weights, extras, batch, hparams, payload, context):
    return self.inner.local_step(weights, extras, batch, hparams, self.payload_of(payload), context)

  def update(self, start, state, hparams, context):
    return self.inner.update(start, state, hparams, context)

  def start_loss(self, payload, examples, hparams):
    return self.inner.start_loss(self.payload_of(payload), examples, hparams)

  def reference_value(self, payload, examples, hparams):
    return self.inner.reference_value(self.payload_of(payload), examples, hparams)

  def client_weight(self, payload, hparams, context):
    return self.inner.client_weight(self.payload_of(payload), hparams, context)


class ServerRule(abc.ABC):
  """Server state, client payload and step of an algorithm; see the module docstring.

  `specs`: TensorSpecs of the model's trainable weights (`model_ops.trainable_specs`).
  `optimizer` (optional): a TFF functional optimizer whose hyperparameters are the
  rule's (`get_hparams`). `keeps_personal_models`: `personal_weights` returns tables.
  """

  keeps_personal_models: bool = False

  def __init__(self, specs, optimizer=None):
    self.specs = tuple(specs)
    self.optimizer = optimizer

  def zeros(self) -> Weights:
    return tuple(tf.zeros(s.shape, s.dtype) for s in self.specs)

  def initialize(self) -> Any:
    """The initial state (before `reset` at the initial weights); override with the
    rule's own NamedTuple (its first field `optimizer_state()`)."""
    return OptimizerState(self.optimizer_state())

  def optimizer_state(self) -> Any:
    """The optimizer's initial state (() without an optimizer)."""
    return () if self.optimizer is None else self.optimizer.initialize(self.specs)

  @abc.abstractmethod
  def update_spec(self) -> Any:
    """The TensorSpec structure of the aggregated update `step` takes."""

  def payload(self, state, weights) -> Any:
    """What every sampled client receives; default: the model weights."""
    del state
    return weights

  def reset(self, state, weights) -> Any:
    """The state restarted at `weights`; default: unchanged."""
    del weights
    return state

  @abc.abstractmethod
  def step(self, state, weights, update) -> ServerStepResult:
    """(new state, new weights) from the aggregated `update`."""

  def optimizer_step(self, state, trainable: Weights, gradient) -> tuple[Any, Weights]:
    """(new optimizer state, trainable after the optimizer's step along `gradient`)."""
    opt_state, trainable = self.optimizer.next(state.optimizer, tuple(trainable), tuple(gradient))
    return opt_state, tuple(trainable)

  def learning_rate(self, optimizer_state) -> tf.Tensor:
    """The optimizer's learning rate (proximal steps scale with it)."""
    hparams = self.optimizer.get_hparams(optimizer_state)
    if LEARNING_RATE not in hparams:
      raise ValueError(
        'The server optimizer must have a learning_rate hyperparameter:'
        ' the proximal step size is server rate x client step sizes.'
      )
    return tf.cast(hparams[LEARNING_RATE], tf.float32)

  def initial_hparams(self) -> collections.OrderedDict:
    """The hyperparameters a run starts with (Adam's betas and epsilon, its rate)."""
    return self.get_hparams(self.initialize())

  def get_hparams(self, state) -> collections.OrderedDict:
    if self.optimizer is None:
      return collections.OrderedDict()
    return collections.OrderedDict(self.optimizer.get_hparams(state.optimizer))

  def set_hparams(self, state, hparams) -> Any:
    if self.optimizer is None:
      return state
    return state._replace(optimizer=self.optimizer.set_hparams(state.optimizer, hparams))

  def personal_weights(self, state) -> Weights | None:
    """Per-client personal models (Ditto), or None."""
    del state
    return None


def with_trainable(weights, trainable: Weights):
  """`weights` (a ModelWeights-like NamedTuple) with new trainable tensors."""
  return weights._replace(trainable=tuple(trainable))
