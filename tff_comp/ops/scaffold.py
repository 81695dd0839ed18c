"""SCAFFOLD's client and server (Karimireddy, Kale, Mohri, Reddi, Stich, Suresh, ICML
2020), pure TF: local SGD corrected by control variates.

    client i, from the broadcast x, control c and its own control c_i, K local steps:
        y <- y - eta_l (g_i(y) + c - c_i)
        c_i+ = c_i - c + (x - y_K) / (K eta_l)              (the paper's option II)
        reports the pseudo-gradient x - y_K (= -Delta y_i) and c_i+ in its row
    server, cohort S of the N clients:
        x <- x + eta_g mean_S Delta y_i                     (server SGD(eta_g))
        c <- c + (1/N) sum_S (c_i+ - c_i)
        c_i <- c_i+ for i in S; the other clients keep theirs

c = c_i = 0 and no correction is FedAvg. The control variates live in the server state
(one row per client, as Ditto's personal models); every client receives the table and
reads its own row. A client with no examples takes no step and keeps its c_i.
"""

import collections
from typing import Any, NamedTuple

import tensorflow as tf

from tff_comp.ops import gradient_transforms, per_client, server_steps, sgd
from tff_comp.ops import rule as rule_lib
from tff_comp.ops.model_ops import Weights


class ControlPayload(NamedTuple):
  """SCAFFOLD's broadcast: the model, the server control c and every client's c_i."""

  weights: object  # ModelWeights
  control: Weights
  controls: Weights  # per trainable tensor, [num_clients, *shape]

  # read at the client's own row (`runtime.client_rows`)
  client_rows = ('controls',)  # type: ignore[misc]


class ControlUpdate(NamedTuple):
  """A SCAFFOLD client's report: pseudo-gradient x - y_K, its new control c_i+ in its
  own row of the table (zeros elsewhere) and a 1 in `visited`."""

  delta: Weights
  controls: Weights  # [num_clients, *shape]
  visited: tf.Tensor  # [num_clients]
  reports_client_state = True  # type: ignore[misc]


class ScaffoldClient(sgd.SGD):
  """SCAFFOLD's client (see the module docstring): local SGD whose one transform is the
  control variate (`gradient_transforms.ControlVariate`). Payload: ControlPayload;
  update: ControlUpdate."""

  uses_client_index = True

  def __init__(self, model, *, learning_rate: float, num_clients: int):
    super().__init__(
      model, learning_rate=learning_rate, transforms=(gradient_transforms.ControlVariate(),)
    )
    self.num_clients = num_clients

  def weights_of(self, payload):
    return payload.weights

  def initialize(self, payload, hparams, context):
    state = super().initialize(payload, hparams, context)
    correction = gradient_transforms.ControlVariate.correct(payload, context.client_index)
    return state._replace(extras=collections.OrderedDict(control_variate=correction))

  def update(self, start, state, hparams, context):
    delta = super().update(start, state, hparams, context)
    scale = tf.math.divide_no_nan(
      1.0, tf.cast(state.steps, tf.float32) * hparams[rule_lib.LEARNING_RATE]
    )
    moved = state.steps > 0
    # c_i+ = c_i - c + (x - y_K) / (K eta_l) = (x - y_K) / (K eta_l) - correction.
    control = state.extras['control_variate']
    own = tuple(
      tf.where(moved, scale * x - d, ci) for ci, d, x in zip(control.own, control.correction, delta)
    )
    return ControlUpdate(
      delta,
      tuple(per_client.slot(c, context, self.num_clients) for c in own),
      tf.one_hot(context.client_index, self.num_clients),
    )


class ControlState(NamedTuple):
  """SCAFFOLD's server state."""

  optimizer: Any  # the optimizer's state (its step on x)
  control: Any  # c, the server control (a tuple like the trainable weights)
  controls: Any  # the c_i: one table [num_clients, ...] per weight

  client_state = ('controls',)  # type: ignore[misc]  # per-client tables (`ops.rule`)


class ControlVariateServer(rule_lib.ServerRule):
  """SCAFFOLD's server (see the module docstring): the optimizer's step on x, the
  control c and the table of client controls c_i (zeros at the start). Broadcasts
  ControlPayload."""

  def __init__(self, specs, optimizer, *, num_clients: int):
    super().__init__(specs, optimizer)
    self.num_clients = num_clients

  def _tables(self):
    return tuple(tf.zeros([self.num_clients, *s.shape], s.dtype) for s in self.specs)

  def initialize(self):
    return ControlState(self.optimizer_state(), self.zeros(), self._tables())

  def update_spec(self):
    return ControlUpdate(
      delta=self.specs,
      controls=tuple(tf.TensorSpec([self.num_clients, *s.shape], s.dtype) for s in self.specs),
      visited=tf.TensorSpec([self.num_clients], tf.float32),
    )

  def step(self, state, weights, update):
    opt_state, trainable = self.optimizer_step(state, weights.trainable, update.delta)
    old = tuple(state.controls)
    new = server_steps.replace_rows(old, tuple(update.controls), update.visited)
    control = tuple(
      c + tf.reduce_sum(n - o, axis=0) / self.num_clients
      for c, n, o in zip(state.control, new, old)
    )
    return rule_lib.ServerStepResult(
      ControlState(opt_state, control, new), rule_lib.with_trainable(weights, trainable)
    )

  def payload(self, state, weights):
    return ControlPayload(weights=weights, control=state.control, controls=state.controls)
