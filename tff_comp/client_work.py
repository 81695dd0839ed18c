"""Client work: runs a pure-TF client update rule on every sampled client.

`build_local_client_work` returns a `tff.learning.templates.ClientWorkProcess`:

    initialize: ( -> H@SERVER)                       H: the rule's hyperparameters
    next: (<H@SERVER, P@CLIENTS, {E*}@CLIENTS> ->
           <state=H@SERVER, result=ClientResult(U, float32)@CLIENTS,
            measurements=M@SERVER>)

P is the payload the server update broadcasts, E one example (client datasets are
unbatched: batching, epochs and steps happen inside, see `ops.local_loop`), U the
rule's update. Measurements: example-weighted mean training loss at the visited
iterates, examples and steps summed over clients.
"""

import collections

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_comp.ops import client_updates
from tff_comp.ops import local_loop


def example_type(model: tff.learning.models.FunctionalModel) -> tff.Type:
  """The TFF type of one example: the model's input spec without the batch dim."""
  spec = tf.nest.map_structure(
      lambda s: tf.TensorSpec(s.shape[1:], s.dtype), model.input_spec
  )
  return tff.types.tensorflow_to_type(spec)


def model_weights_type(model: tff.learning.models.FunctionalModel) -> tff.Type:
  """The TFF type of `tff.learning.models.ModelWeights` for a FunctionalModel."""
  trainable, non_trainable = model.initial_weights
  spec = tff.learning.models.ModelWeights(
      tuple(tf.TensorSpec(w.shape, w.dtype) for w in trainable),
      tuple(tf.TensorSpec(w.shape, w.dtype) for w in non_trainable),
  )
  return tff.types.tensorflow_to_type(spec)


def build_local_client_work(
    rule: client_updates.ClientUpdateRule,
    payload_type: tff.Type,
    *,
    batch_size: int,
    local_epochs: int = 1,
    client_weighting: tff.learning.ClientWeighting = tff.learning.ClientWeighting.NUM_EXAMPLES,
) -> tff.learning.templates.ClientWorkProcess:
  """Builds client work that applies `rule` on each client's local batches.

  Args:
    rule: the pure-TF client update rule (its model gives the example type).
    payload_type: unplaced TFF type of what the server broadcasts to clients.
    batch_size: examples per local step.
    local_epochs: passes over the client's examples per round.
    client_weighting: NUM_EXAMPLES weighs a client by examples processed, UNIFORM
      by 1 (as in TFF's FedAvg).

  Returns:
    A `tff.learning.templates.ClientWorkProcess`.
  """
  if batch_size < 1:
    raise ValueError(f'batch_size must be >= 1, got {batch_size}.')
  if local_epochs < 1:
    raise ValueError(f'local_epochs must be >= 1, got {local_epochs}.')
  if not isinstance(client_weighting, tff.learning.ClientWeighting):
    raise ValueError(
        f'client_weighting must be a tff.learning.ClientWeighting, got'
        f' {client_weighting!r}.'
    )
  hparams = collections.OrderedDict(
      (k, np.float32(v)) for k, v in rule.initial_hparams().items()
  )
  hparams_type = tff.types.tensorflow_to_type(
      collections.OrderedDict((k, tf.TensorSpec([], tf.float32)) for k in hparams)
  )
  data_type = tff.SequenceType(example_type(rule.model))

  @tff.tensorflow.computation(payload_type, data_type, hparams_type)
  def client_update(payload, dataset, hparams):
    examples = local_loop.materialize(dataset)
    state = rule.initialize(payload, hparams)
    state, steps = local_loop.run_local_steps(
        lambda s, batch: rule.step(s, batch, payload, hparams),
        state,
        examples,
        batch_size=batch_size,
        epochs=local_epochs,
    )
    examples_seen = tf.cast(state.examples, tf.float32)
    if client_weighting is tff.learning.ClientWeighting.NUM_EXAMPLES:
      weight = examples_seen
    else:
      weight = tf.constant(1.0)
    result = tff.learning.templates.ClientResult(
        update=rule.finalize(state, payload, hparams), update_weight=weight
    )
    stats = collections.OrderedDict(
        loss_sum=state.loss_sum,
        num_examples=examples_seen,
        num_steps=tf.cast(steps, tf.float32),
    )
    return result, stats

  @tff.tensorflow.computation
  def finalize_stats(stats):
    return collections.OrderedDict(
        train_loss=tf.math.divide_no_nan(stats['loss_sum'], stats['num_examples']),
        num_examples=stats['num_examples'],
        num_steps=stats['num_steps'],
    )

  @tff.federated_computation
  def init_fn():
    return tff.federated_value(hparams, tff.SERVER)

  @tff.federated_computation(
      init_fn.type_signature.result,
      tff.FederatedType(payload_type, tff.CLIENTS),
      tff.FederatedType(data_type, tff.CLIENTS),
  )
  def next_fn(state, payload, data):
    client_hparams = tff.federated_broadcast(state)
    result, stats = tff.federated_map(client_update, (payload, data, client_hparams))
    measurements = tff.federated_map(finalize_stats, tff.federated_sum(stats))
    return tff.templates.MeasuredProcessOutput(state, result, measurements)

  @tff.tensorflow.computation(hparams_type)
  def get_hparams_fn(state):
    return state

  @tff.tensorflow.computation(hparams_type, hparams_type)
  def set_hparams_fn(state, new_hparams):
    del state
    return new_hparams

  return tff.learning.templates.ClientWorkProcess(
      init_fn,
      next_fn,
      get_hparams_fn=get_hparams_fn,
      set_hparams_fn=set_hparams_fn,
  )
