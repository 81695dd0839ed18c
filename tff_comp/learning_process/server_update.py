"""Server update: places a pure-TF server rule (`ops.rule.ServerRule`) at the TFF server.

A `ServerUpdateProcess` is a `tff.learning.templates.FinalizerProcess`

    initialize: ( -> S@SERVER)
    next: (<S@SERVER, W@SERVER, U@SERVER> -> <state=S@SERVER, result=W@SERVER,
           measurements=M@SERVER>)          W: ModelWeights, U: aggregated update

with more unplaced TF computations that let its state reach clients:

    client_payload: (<S, W> -> P)   what every sampled client receives
    reset: (<S, W> -> S)            restart the state at weights W (run at
                                    initialization and by set_model_weights)
    personal_weights: (S -> V)      optional: per-client personal models (Ditto)

TFF's own finalizers broadcast only the model; algorithms such as FedDualAvg keep a
dual state on the server that clients need. `build_server_update` is the one wrapper
for every server rule; `from_finalizer` wraps a TFF finalizer.
"""

import tensorflow_federated as tff

from tff_comp.ops import rule as rule_lib


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
      initialize_fn, next_fn, get_hparams_fn=get_hparams_fn, set_hparams_fn=set_hparams_fn
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


def _payload_and_reset_of_weights(state_type: tff.Type, weights_type: tff.Type):
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
  payload, reset = _payload_and_reset_of_weights(state_type, weights_type)
  return ServerUpdateProcess(
    finalizer.initialize,
    finalizer.next,
    client_payload_fn=payload,
    reset_fn=reset,
    get_hparams_fn=finalizer.get_hparams,
    set_hparams_fn=finalizer.set_hparams,
  )


def build_server_update(rule: rule_lib.ServerRule, weights_type: tff.Type) -> ServerUpdateProcess:
  """Places `rule`'s initialize, step, payload, reset and hyperparameters at the server.

  Its `next` takes the aggregated update of `rule.update_spec()`'s type and measures
  nothing; get/set_hparams expose the rule's (its optimizer's) hyperparameters.
  """

  @tff.tensorflow.computation
  def init_state():
    return rule.initialize()

  state_type = init_state.type_signature.result
  update_type = tff.types.tensorflow_to_type(rule.update_spec())

  @tff.tensorflow.computation(state_type, weights_type, update_type)
  def server_step(state, weights, update):
    return rule.step(state, weights, update)

  @tff.tensorflow.computation(state_type, weights_type)
  def client_payload(state, weights):
    return rule.payload(state, weights)

  @tff.tensorflow.computation(state_type, weights_type)
  def reset(state, weights):
    return rule.reset(state, weights)

  @tff.tensorflow.computation(state_type)
  def get_hparams(state):
    return rule.get_hparams(state)

  @tff.tensorflow.computation(state_type, get_hparams.type_signature.result)
  def set_hparams(state, hparams):
    return rule.set_hparams(state, hparams)

  personal_weights = None
  if rule.keeps_personal_models:

    @tff.tensorflow.computation(state_type)
    def personal_weights(state):
      return rule.personal_weights(state)

  @tff.federated_computation
  def init_fn():
    return tff.federated_eval(init_state, tff.SERVER)

  @tff.federated_computation(
    tff.FederatedType(state_type, tff.SERVER),
    tff.FederatedType(weights_type, tff.SERVER),
    tff.FederatedType(update_type, tff.SERVER),
  )
  def next_fn(state, weights, update):
    new_state, new_weights = tff.federated_map(server_step, (state, weights, update))
    return tff.templates.MeasuredProcessOutput(
      new_state, new_weights, tff.federated_value((), tff.SERVER)
    )

  return ServerUpdateProcess(
    init_fn,
    next_fn,
    client_payload_fn=client_payload,
    reset_fn=reset,
    get_hparams_fn=get_hparams,
    set_hparams_fn=set_hparams,
    personal_weights_fn=personal_weights,
  )
