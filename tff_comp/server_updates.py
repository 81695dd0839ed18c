"""Server updates: finalizers that also say what the server broadcasts.

A `ServerUpdateProcess` is a `tff.learning.templates.FinalizerProcess`

    initialize: ( -> S@SERVER)
    next: (<S@SERVER, W@SERVER, U@SERVER> -> <state=S@SERVER, result=W@SERVER,
           measurements=M@SERVER>)          W: ModelWeights, U: aggregated update

with two more unplaced TF computations that let its state reach clients:

    client_payload: (<S, W> -> P)   what every sampled client receives
    reset: (<S, W> -> S)            restart the state at weights W (run at
                                    initialization and by set_model_weights)
    personal_weights: (S -> V)      optional: per-client personal models (Ditto)

TFF's own finalizers broadcast only the model; algorithms such as FedDualAvg keep a
dual state on the server that clients need (see ../shared/conventions.md on Mime Lite).
"""

import collections
from typing import NamedTuple

import tensorflow as tf
import tensorflow_federated as tff

from tff_comp import regularizers as regularizers_lib
from tff_comp.ops import client_updates
from tff_comp.ops import server_steps


class ServerUpdateProcess(tff.learning.templates.FinalizerProcess):
  """A FinalizerProcess with a client payload and a reset; see the module doc."""

  def __init__(
      self,
      initialize_fn: tff.Computation,
      next_fn: tff.Computation,
      *,
      client_payload_fn: tff.Computation,
      reset_fn: tff.Computation,
      get_hparams_fn: tff.Computation | None = None,
      set_hparams_fn: tff.Computation | None = None,
      personal_weights_fn: tff.Computation | None = None,
  ):
    super().__init__(
        initialize_fn,
        next_fn,
        get_hparams_fn=get_hparams_fn,
        set_hparams_fn=set_hparams_fn,
    )
    self._client_payload_fn = client_payload_fn
    self._reset_fn = reset_fn
    self._personal_weights_fn = personal_weights_fn

  @property
  def client_payload(self) -> tff.Computation:
    return self._client_payload_fn

  @property
  def reset(self) -> tff.Computation:
    return self._reset_fn

  @property
  def personal_weights(self) -> tff.Computation | None:
    """(S -> per-client trainable tables), for updates that keep personal models."""
    return self._personal_weights_fn


def _broadcast_weights_fns(state_type: tff.Type, weights_type: tff.Type):
  """client_payload = the model weights; reset = keep the state."""

  @tff.tensorflow.computation(state_type, weights_type)
  def client_payload(state, weights):
    del state
    return weights

  @tff.tensorflow.computation(state_type, weights_type)
  def reset(state, weights):
    del weights
    return state

  return client_payload, reset


def from_finalizer(
    finalizer: tff.learning.templates.FinalizerProcess, weights_type: tff.Type
) -> ServerUpdateProcess:
  """Wraps a TFF finalizer whose clients need only the model weights."""
  state_type = finalizer.initialize.type_signature.result.member
  payload, reset = _broadcast_weights_fns(state_type, weights_type)
  return ServerUpdateProcess(
      finalizer.initialize,
      finalizer.next,
      client_payload_fn=payload,
      reset_fn=reset,
      get_hparams_fn=finalizer.get_hparams,
      set_hparams_fn=finalizer.set_hparams,
  )


def build_optimizer_update(
    optimizer: tff.learning.optimizers.Optimizer, weights_type: tff.Type
) -> ServerUpdateProcess:
  """w_{r+1} = optimizer step from w_r with the mean update as gradient.

  This is TFF's own `build_apply_optimizer_finalizer` (FedAvg's server); with SGD of
  rate eta_s it is w_{r+1} = w_r + eta_s Delta.
  """
  finalizer = tff.learning.templates.build_apply_optimizer_finalizer(
      optimizer, weights_type
  )
  return from_finalizer(finalizer, weights_type)


def _learning_rate(optimizer, optimizer_state) -> tf.Tensor:
  hparams = optimizer.get_hparams(optimizer_state)
  if tff.learning.optimizers.LEARNING_RATE_KEY not in hparams:
    raise ValueError(
        'The server optimizer must have a learning_rate hyperparameter: the'
        ' proximal step size is server learning rate x client step sizes.'
    )
  return tf.cast(hparams[tff.learning.optimizers.LEARNING_RATE_KEY], tf.float32)


def _tensor_specs(weights_type: tff.Type):
  return tuple(
      tf.TensorSpec(t.shape, t.dtype) for t in weights_type.trainable  # pytype: disable=attribute-error
  )


def _optimizer_hparams_fns(optimizer, state_type: tff.Type):
  """get/set_hparams exposing the optimizer's hyperparameters."""

  @tff.tensorflow.computation(state_type)
  def get_hparams(state):
    return optimizer.get_hparams(state['optimizer'])

  @tff.tensorflow.computation(state_type, get_hparams.type_signature.result)
  def set_hparams(state, hparams):
    new_state = collections.OrderedDict(state)
    new_state['optimizer'] = optimizer.set_hparams(state['optimizer'], hparams)
    return new_state

  return get_hparams, set_hparams


def build_mirror_descent_update(
    optimizer: tff.learning.optimizers.Optimizer,
    weights_type: tff.Type,
    regularizer: regularizers_lib.Regularizer,
) -> ServerUpdateProcess:
  """FedMiD's server: w_{r+1} = prox_{eta_s mean(sum eta_c) psi}(w_r + eta_s Delta).

  Takes `ElapsedUpdate`s (mean pseudo-gradient and mean client sum of eta_c). The
  optimizer makes the step w_r + eta_s Delta (SGD in the paper) and eta_s is its
  learning rate. Clients need the model only.

  Reference: Yuan, Zaheer, Reddi. Federated Composite Optimization. ICML 2021.
  """
  specs = _tensor_specs(weights_type)

  @tff.tensorflow.computation
  def init_state():
    return collections.OrderedDict(optimizer=optimizer.initialize(specs))

  state_type = init_state.type_signature.result
  update_type = tff.types.tensorflow_to_type(_elapsed_update_spec(weights_type))

  @tff.tensorflow.computation(state_type, weights_type, update_type)
  def server_step(state, weights, update):
    opt_state, trainable = optimizer.next(
        state['optimizer'], tuple(weights.trainable), tuple(update.delta)
    )
    trainable = server_steps.mirror_descent_server_step(
        tuple(trainable),
        regularizer,
        _learning_rate(optimizer, opt_state),
        update.lr_sum,
    )
    new_weights = tff.learning.models.ModelWeights(trainable, weights.non_trainable)
    return collections.OrderedDict(optimizer=opt_state), new_weights

  return _server_update_process(
      init_state, server_step, weights_type, optimizer, *_broadcast_weights_fns(
          state_type, weights_type
      )
  )


class DualPayload(NamedTuple):
  """What FedDualAvg's server broadcasts: the dual state and the elapsed coefficient."""

  dual: tff.learning.models.ModelWeights
  elapsed: tf.Tensor


def build_dual_averaging_update(
    optimizer: tff.learning.optimizers.Optimizer,
    weights_type: tff.Type,
    regularizer: regularizers_lib.Regularizer,
) -> ServerUpdateProcess:
  """FedDualAvg's server: dual step, then the primal by the elapsed prox.

      z_{r+1} = z_r + eta_s Delta          (the optimizer's step on the dual)
      c_{r+1} = c_r + eta_s mean(sum eta_c)
      w_{r+1} = prox_{c_{r+1} psi}(z_{r+1})

  State: optimizer state, dual z and elapsed coefficient c (z_0 = w_0, c_0 = 0 via
  `reset`). Broadcasts `DualPayload(dual, elapsed)`; exposes the primal w as the model.

  Reference: Yuan, Zaheer, Reddi. Federated Composite Optimization. ICML 2021.
  """
  specs = _tensor_specs(weights_type)

  @tff.tensorflow.computation
  def init_state():
    return collections.OrderedDict(
        optimizer=optimizer.initialize(specs),
        dual=tuple(tf.zeros(s.shape, s.dtype) for s in specs),
        elapsed=tf.constant(0.0),
    )

  state_type = init_state.type_signature.result
  update_type = tff.types.tensorflow_to_type(_elapsed_update_spec(weights_type))

  @tff.tensorflow.computation(state_type, weights_type, update_type)
  def server_step(state, weights, update):
    opt_state, dual = optimizer.next(
        state['optimizer'], tuple(state['dual']), tuple(update.delta)
    )
    trainable, elapsed = server_steps.dual_averaging_server_step(
        tuple(dual),
        state['elapsed'],
        regularizer,
        _learning_rate(optimizer, opt_state),
        update.lr_sum,
    )
    new_state = collections.OrderedDict(
        optimizer=opt_state, dual=tuple(dual), elapsed=elapsed
    )
    return new_state, tff.learning.models.ModelWeights(
        trainable, weights.non_trainable
    )

  @tff.tensorflow.computation(state_type, weights_type)
  def client_payload(state, weights):
    return DualPayload(
        dual=tff.learning.models.ModelWeights(
            state['dual'], weights.non_trainable
        ),
        elapsed=state['elapsed'],
    )

  @tff.tensorflow.computation(state_type, weights_type)
  def reset(state, weights):
    return collections.OrderedDict(
        optimizer=state['optimizer'],
        dual=weights.trainable,
        elapsed=tf.constant(0.0),
    )

  return _server_update_process(
      init_state, server_step, weights_type, optimizer, client_payload, reset
  )


def _elapsed_update_spec(weights_type: tff.Type):
  return client_updates.ElapsedUpdate(
      delta=_tensor_specs(weights_type), lr_sum=tf.TensorSpec([], tf.float32)
  )


def _server_update_process(
    init_state, server_step, weights_type, optimizer, client_payload, reset,
    personal_weights=None,
) -> ServerUpdateProcess:
  """Places a (state, weights, update) -> (state, weights) TF step at the server."""
  state_type = init_state.type_signature.result
  update_type = server_step.type_signature.parameter[2]

  @tff.federated_computation
  def init_fn():
    return tff.federated_eval(init_state, tff.SERVER)

  @tff.federated_computation(
      tff.FederatedType(state_type, tff.SERVER),
      tff.FederatedType(weights_type, tff.SERVER),
      tff.FederatedType(update_type, tff.SERVER),
  )
  def next_fn(state, weights, update):
    new_state, new_weights = tff.federated_map(
        server_step, (state, weights, update)
    )
    return tff.templates.MeasuredProcessOutput(
        new_state, new_weights, tff.federated_value((), tff.SERVER)
    )

  get_hparams, set_hparams = (
      _optimizer_hparams_fns(optimizer, state_type) if optimizer else (None, None))
  return ServerUpdateProcess(
      init_fn,
      next_fn,
      client_payload_fn=client_payload,
      reset_fn=reset,
      get_hparams_fn=get_hparams,
      set_hparams_fn=set_hparams,
      personal_weights_fn=personal_weights,
  )


def build_tracker_averaging_update(
    optimizer: tff.learning.optimizers.Optimizer,
    weights_type: tff.Type,
    tracker_spec,
) -> ServerUpdateProcess:
  """Local-SCGDM's server: averages the clients' model, tracker u and momentum m.

      x_{r+1} = optimizer step from x_r with the mean pseudo-gradient
                (SGD with rate 1 is the plain mean of client models)
      u_{r+1} = mean_i u_i,  m_{r+1} = mean_i m_i

  State: optimizer state, u, m, the reference loss m is expressed in, and `started`
  (0 until the first round). Broadcasts `TrackerPayload`; takes `TrackerUpdate`s.
  `tracker_spec` is the TensorSpec structure of u (the objective's inner value).

  Reference: Gao, Li, Huang. Local stochastic compositional gradient descent with momentum.
  """
  specs = _tensor_specs(weights_type)

  @tff.tensorflow.computation
  def init_state():
    return collections.OrderedDict(
        optimizer=optimizer.initialize(specs),
        u=tf.nest.map_structure(lambda s: tf.zeros(s.shape, s.dtype), tracker_spec),
        m=tuple(tf.zeros(s.shape, s.dtype) for s in specs),
        reference_loss=tf.constant(0.0),
        started=tf.constant(0.0),
    )

  state_type = init_state.type_signature.result
  update_type = tff.types.tensorflow_to_type(client_updates.TrackerUpdate(
      delta=specs, u=tracker_spec, m=specs, reference_loss=tf.TensorSpec([], tf.float32)))

  @tff.tensorflow.computation(state_type, weights_type, update_type)
  def server_step(state, weights, update):
    opt_state, trainable = optimizer.next(
        state['optimizer'], tuple(weights.trainable), tuple(update.delta))
    new_state = collections.OrderedDict(
        optimizer=opt_state, u=update.u, m=tuple(update.m),
        reference_loss=update.reference_loss, started=tf.constant(1.0))
    return new_state, tff.learning.models.ModelWeights(trainable, weights.non_trainable)

  @tff.tensorflow.computation(state_type, weights_type)
  def client_payload(state, weights):
    return client_updates.TrackerPayload(
        weights=weights, u=state['u'], m=state['m'],
        reference_loss=state['reference_loss'], started=state['started'])

  @tff.tensorflow.computation(state_type, weights_type)
  def reset(state, weights):
    del weights
    return collections.OrderedDict(
        optimizer=state['optimizer'],
        u=tf.nest.map_structure(tf.zeros_like, state['u']),
        m=tf.nest.map_structure(tf.zeros_like, state['m']),
        reference_loss=tf.constant(0.0), started=tf.constant(0.0))

  return _server_update_process(
      init_state, server_step, weights_type, optimizer, client_payload, reset)


def build_ratio_update(weights_type: tff.Type) -> ServerUpdateProcess:
  """q-FedAvg's server: w_{r+1} = w_r - sum_i Delta_i / sum_i h_i.

  Takes the (uniform) mean of `QUpdate(delta, h)`s: the ratio of means is the ratio
  of sums. Stateless; broadcasts the model.
  """

  @tff.tensorflow.computation
  def init_state():
    return collections.OrderedDict()

  update_type = tff.types.tensorflow_to_type(client_updates.QUpdate(
      delta=_tensor_specs(weights_type), h=tf.TensorSpec([], tf.float32)))

  @tff.tensorflow.computation(init_state.type_signature.result, weights_type, update_type)
  def server_step(state, weights, update):
    trainable = tuple(w - tf.math.divide_no_nan(d, update.h)
                      for w, d in zip(weights.trainable, update.delta))
    return state, tff.learning.models.ModelWeights(trainable, weights.non_trainable)

  return _server_update_process(
      init_state, server_step, weights_type, None,
      *_broadcast_weights_fns(init_state.type_signature.result, weights_type))


def build_agnostic_update(
    optimizer: tff.learning.optimizers.Optimizer,
    weights_type: tff.Type,
    num_clients: int,
    lambda_learning_rate: float,
    *,
    ascent: str = 'projected',
) -> ServerUpdateProcess:
  """AFL's (and TR-MAML's) server: a model step on the lambda-weighted mean update,
  then ascent on the client weights,

      projected (AFL):          lambda <- Proj_simplex(lambda + lr_lambda * losses)
      exponentiated (TR-MAML):  lambda <- lambda exp(lr_lambda * losses) / normalizer

  losses being the round's clients' reported losses (0 for the others).
  State: optimizer state and lambda (uniform at the start). Broadcasts AFLPayload.

  Reference: Mohri, Sivek, Suresh. Agnostic federated learning. ICML 2019.
  """
  if ascent not in ('projected', 'exponentiated'):
    raise ValueError(f"ascent={ascent!r} must be 'projected' or 'exponentiated'.")
  specs = _tensor_specs(weights_type)

  @tff.tensorflow.computation
  def init_state():
    return collections.OrderedDict(
        optimizer=optimizer.initialize(specs),
        client_weights=tf.fill([num_clients], 1.0 / num_clients))

  state_type = init_state.type_signature.result
  update_type = tff.types.tensorflow_to_type(client_updates.AFLUpdate(
      delta=specs, losses=tf.TensorSpec([num_clients], tf.float32)))

  @tff.tensorflow.computation(state_type, weights_type, update_type)
  def server_step(state, weights, update):
    opt_state, trainable = optimizer.next(
        state['optimizer'], tuple(weights.trainable), tuple(update.delta))
    if ascent == 'projected':
      lam = server_steps.project_simplex(
          state['client_weights'] + lambda_learning_rate * update.losses)
    else:
      lam = server_steps.exponentiated_gradient_step(
          state['client_weights'], update.losses, lambda_learning_rate)
    return (collections.OrderedDict(optimizer=opt_state, client_weights=lam),
            tff.learning.models.ModelWeights(trainable, weights.non_trainable))

  @tff.tensorflow.computation(state_type, weights_type)
  def client_payload(state, weights):
    return client_updates.AFLPayload(weights=weights, client_weights=state['client_weights'])

  @tff.tensorflow.computation(state_type, weights_type)
  def reset(state, weights):
    del weights
    return collections.OrderedDict(
        optimizer=state['optimizer'],
        client_weights=tf.fill([num_clients], 1.0 / num_clients))

  return _server_update_process(
      init_state, server_step, weights_type, optimizer, client_payload, reset)


def build_personal_models_update(
    optimizer: tff.learning.optimizers.Optimizer,
    weights_type: tff.Type,
    num_clients: int,
) -> ServerUpdateProcess:
  """Ditto's server: the optimizer step on the global model (FedAvg's server) and a
  table of personal models, one row per client,

      w_{r+1} = optimizer step from w_r with the mean pseudo-gradient
      v_i <- the v_i client i returned, for the round's clients; unchanged otherwise

  State: optimizer state and the table (every row starts at the initial model via
  `reset`). Broadcasts `DittoPayload(weights, table)`: every client receives the whole
  table (num_clients x model size) and reads its row. That is simple and cheap for
  simulations with up to hundreds of small models; `tff.federated_select` would send
  each client its row only. `personal_weights` returns the table.

  Reference: Li, Hu, Beirami, Smith. Ditto: fair and robust federated learning through
  personalization. ICML 2021.
  """
  specs = _tensor_specs(weights_type)

  def tile(trainable):
    return tuple(tf.tile(w[tf.newaxis], [num_clients] + [1] * w.shape.rank)
                 for w in trainable)

  @tff.tensorflow.computation
  def init_state():
    return collections.OrderedDict(
        optimizer=optimizer.initialize(specs),
        personal=tile(tuple(tf.zeros(s.shape, s.dtype) for s in specs)))

  state_type = init_state.type_signature.result
  update_type = tff.types.tensorflow_to_type(client_updates.DittoUpdate(
      delta=specs,
      personal=tuple(tf.TensorSpec([num_clients, *s.shape], s.dtype) for s in specs),
      visited=tf.TensorSpec([num_clients], tf.float32)))

  @tff.tensorflow.computation(state_type, weights_type, update_type)
  def server_step(state, weights, update):
    opt_state, trainable = optimizer.next(
        state['optimizer'], tuple(weights.trainable), tuple(update.delta))
    personal = server_steps.replace_rows(
        tuple(state['personal']), tuple(update.personal), update.visited)
    return (collections.OrderedDict(optimizer=opt_state, personal=personal),
            tff.learning.models.ModelWeights(trainable, weights.non_trainable))

  @tff.tensorflow.computation(state_type, weights_type)
  def client_payload(state, weights):
    return client_updates.DittoPayload(weights=weights, personal=state['personal'])

  @tff.tensorflow.computation(state_type, weights_type)
  def reset(state, weights):
    return collections.OrderedDict(optimizer=state['optimizer'],
                                   personal=tile(tuple(weights.trainable)))

  @tff.tensorflow.computation(state_type)
  def personal_weights(state):
    return state['personal']

  return _server_update_process(
      init_state, server_step, weights_type, optimizer, client_payload, reset,
      personal_weights)
