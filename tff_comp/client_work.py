"""Client work: runs a pure-TF client update rule on every sampled client.

`build_local_client_work` returns a `tff.learning.templates.ClientWorkProcess`:

    initialize: ( -> S@SERVER)          S = <hparams=H, round=int32>
    next: (<S@SERVER, P@CLIENTS, {E*}@CLIENTS> ->
           <state=S@SERVER, result=ClientResult(U, float32)@CLIENTS,
            measurements=M@SERVER>)

H holds the rule's hyperparameters (get/set_hparams), P is the payload the server
update broadcasts, E one example (client datasets are unbatched: batching, epochs and
steps happen inside, see `ops.local_loop`), U the rule's update. Measurements:
example-weighted mean training loss at the visited iterates, examples processed and
steps summed over clients.

Heterogeneous local work (FedNova's setting): with `local_epochs_max`, each client
draws its epochs E uniformly from [local_epochs, local_epochs_max] every round and
takes tau_i = floor(E n_i / B) steps. The draw is a stateless function of (seed,
round, a fingerprint of the client's data), so runs are reproducible without any
client id reaching the computation.
"""

import collections
from typing import Any, NamedTuple

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_comp.ops import client_updates
from tff_comp.ops import local_loop
from tff_comp.ops import model_ops


class IndexedExample(NamedTuple):
  """An example with the index of the client holding it (for rules that keep
  per-client state on the server, such as AFL's client weights). Fields are in sorted
  order, so TFF can serialize Python datasets of them."""

  client_index: Any
  example: Any


def indexed_dataset_computation(client_data) -> tff.Computation:
  """client id -> its dataset of IndexedExamples (index = position in client_ids)."""
  ids = list(client_data.client_ids)
  fn = client_data.serializable_dataset_fn

  @tff.tensorflow.computation(tf.string)
  def dataset_computation(client_id):
    table = tf.lookup.StaticHashTable(
        tf.lookup.KeyValueTensorInitializer(ids, tf.range(len(ids), dtype=tf.int32)), -1)
    index = table.lookup(client_id)
    return fn(client_id).map(lambda *e: IndexedExample(client_index=index, example=e if len(e) > 1 else e[0]))

  return dataset_computation


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
    local_epochs_max: int | None = None,
    local_steps: int | None = None,
    seed: int = 0,
    client_weighting: tff.learning.ClientWeighting = tff.learning.ClientWeighting.NUM_EXAMPLES,
) -> tff.learning.templates.ClientWorkProcess:
  """Builds client work that applies `rule` on each client's local batches.

  Args:
    rule: the pure-TF client update rule (its model gives the example type).
    payload_type: unplaced TFF type of what the server broadcasts to clients.
    batch_size: examples per local step.
    local_epochs: passes over the client's examples per round (the minimum when
      `local_epochs_max` is set).
    local_epochs_max: if set, epochs are drawn per client per round from
      [local_epochs, local_epochs_max] and steps are floor(E n_i / B).
    local_steps: if set, exactly this many steps per round (tau), cycling through the
      client's examples; overrides epochs.
    seed: seed of the epoch draws.
    client_weighting: NUM_EXAMPLES weighs a client by the examples it holds (n_i;
      the same weighted mean as TFF's count of examples processed whenever all
      clients run the same epochs), UNIFORM by 1.

  Returns:
    A `tff.learning.templates.ClientWorkProcess`.
  """
  if batch_size < 1:
    raise ValueError(f'batch_size must be >= 1, got {batch_size}.')
  if local_epochs < 1:
    raise ValueError(f'local_epochs must be >= 1, got {local_epochs}.')
  if local_steps is not None and local_steps < 1:
    raise ValueError(f'local_steps must be >= 1, got {local_steps}.')
  if local_epochs_max is not None and local_epochs_max < local_epochs:
    raise ValueError(f'local_epochs_max ({local_epochs_max}) must be >= local_epochs'
                     f' ({local_epochs}).')
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
  element_type = example_type(rule.model)
  if rule.uses_client_index:
    element_type = tff.types.tensorflow_to_type(IndexedExample(
        client_index=tf.TensorSpec([], tf.int32),
        example=tff.types.type_to_tf_tensor_specs(element_type)))
  data_type = tff.SequenceType(element_type)

  state_type = tff.types.tensorflow_to_type(collections.OrderedDict(
      hparams=hparams_type, round=tf.TensorSpec([], tf.int32)))

  step_examples = batch_size * rule.batches_per_step

  def client_update_fn(payload, dataset, work_state, reference_loss):
    hparams = work_state['hparams']
    if rule.uses_reference_loss:
      hparams = collections.OrderedDict(hparams, reference_loss=reference_loss)
    examples = local_loop.materialize(dataset)
    if rule.uses_client_index:
      hparams = collections.OrderedDict(
          hparams, client_index=tf.cast(examples.client_index[0], tf.float32))
      examples = examples.example
    if rule.uses_start_loss:
      hparams = collections.OrderedDict(
          hparams, start_loss=rule.start_loss(payload, examples))
    if local_epochs_max is None:
      epochs, drop_remainder = local_epochs, False
    else:
      epochs, drop_remainder = local_loop.draw_epochs(
          examples, seed, work_state['round'], local_epochs, local_epochs_max), True
    state = rule.initialize(payload, hparams)
    state, steps = local_loop.run_local_steps(
        lambda s, batch: rule.step(s, batch, payload, hparams),
        state,
        examples,
        batch_size=step_examples,
        epochs=epochs,
        drop_remainder=drop_remainder,
        steps=local_steps,
    )
    examples_seen = tf.cast(state.examples, tf.float32)
    weight = rule.client_weight(payload, hparams)
    if weight is None and client_weighting is tff.learning.ClientWeighting.NUM_EXAMPLES:
      weight = tf.cast(local_loop.num_examples(examples), tf.float32)
    elif weight is None:
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

  # Only rules that use the round's reference loss receive it (a broadcast saved).
  if rule.uses_reference_loss:

    @tff.tensorflow.computation(payload_type, data_type, state_type, tf.float32)
    def client_update(payload, dataset, work_state, reference_loss):
      return client_update_fn(payload, dataset, work_state, reference_loss)

  else:

    @tff.tensorflow.computation(payload_type, data_type, state_type)
    def client_update(payload, dataset, work_state):
      return client_update_fn(payload, dataset, work_state, None)

  @tff.tensorflow.computation
  def finalize_stats(stats, reference_loss):
    measurements = collections.OrderedDict(
        train_loss=tf.math.divide_no_nan(stats['loss_sum'], stats['num_examples']),
        num_examples=stats['num_examples'],
        num_steps=stats['num_steps'],
    )
    if rule.uses_reference_loss:
      measurements['reference_loss'] = reference_loss
    return measurements

  @tff.federated_computation
  def init_fn():
    return tff.federated_value(
        collections.OrderedDict(hparams=hparams, round=np.int32(0)), tff.SERVER)

  @tff.tensorflow.computation(state_type)
  def next_round(state):
    return collections.OrderedDict(hparams=state['hparams'], round=state['round'] + 1)

  @tff.tensorflow.computation(payload_type, data_type)
  def loss_at_payload(payload, dataset):
    examples = local_loop.materialize(dataset)
    if rule.uses_client_index:
      examples = examples.example
    return rule.reference_value(payload, examples)

  @tff.federated_computation(
      init_fn.type_signature.result,
      tff.FederatedType(payload_type, tff.CLIENTS),
      tff.FederatedType(data_type, tff.CLIENTS),
  )
  def next_fn(state, payload, data):
    client_state = tff.federated_broadcast(state)
    if rule.uses_reference_loss:
      # The round's common reference: the largest client loss at the broadcast model.
      reference = tff.federated_max(tff.federated_map(loss_at_payload, (payload, data)))
      result, stats = tff.federated_map(
          client_update, (payload, data, client_state, tff.federated_broadcast(reference)))
    else:
      reference = tff.federated_value(np.float32(0.0), tff.SERVER)
      result, stats = tff.federated_map(client_update, (payload, data, client_state))
    measurements = tff.federated_map(
        finalize_stats, (tff.federated_sum(stats), reference))
    return tff.templates.MeasuredProcessOutput(
        tff.federated_map(next_round, state), result, measurements)

  @tff.tensorflow.computation(state_type)
  def get_hparams_fn(state):
    return state['hparams']

  @tff.tensorflow.computation(state_type, hparams_type)
  def set_hparams_fn(state, new_hparams):
    return collections.OrderedDict(hparams=new_hparams, round=state['round'])

  return tff.learning.templates.ClientWorkProcess(
      init_fn,
      next_fn,
      get_hparams_fn=get_hparams_fn,
      set_hparams_fn=set_hparams_fn,
  )
