"""Client work: places one client's round (`ops.client_round.run_client`) on TFF clients.

`build_local_client_work` returns a `tff.learning.templates.ClientWorkProcess`:

    initialize: ( -> S@SERVER)          S = ClientWorkState(hparams=H, round=int32)
    next: (<S@SERVER, P@CLIENTS, {E*}@CLIENTS> ->
           <state=S@SERVER, result=ClientResult(U, float32)@CLIENTS,
            measurements=M@SERVER>)

H holds the rule's hyperparameters (get/set_hparams), P is the payload the server
update broadcasts, E one example (client datasets are unbatched: the client round batches),
U the rule's update. Measurements (`ops.client_round.train_metrics`): example-weighted mean
training loss, examples processed and steps, summed over clients. Rules that use the
round's reference loss get it through a first stage (the largest `reference_value` of
the round's clients, `federated_max`); rules with per-client state read their index
from datasets of `IndexedExample`s (`indexed_dataset_computation`).
"""

import collections
from typing import Any, NamedTuple

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_comp.ops import client_round, local_loop
from tff_comp.ops import rule as rule_lib


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
      tf.lookup.KeyValueTensorInitializer(ids, tf.range(len(ids), dtype=tf.int32)), -1
    )
    index = table.lookup(client_id)
    return fn(client_id).map(
      lambda *e: IndexedExample(client_index=index, example=e if len(e) > 1 else e[0])
    )

  return dataset_computation


def example_type(model: tff.learning.models.FunctionalModel) -> tff.Type:
  """The TFF type of one example: the model's input spec without the batch dim."""
  spec = tf.nest.map_structure(lambda s: tf.TensorSpec(s.shape[1:], s.dtype), model.input_spec)
  return tff.types.tensorflow_to_type(spec)


def model_weights_type(model: tff.learning.models.FunctionalModel) -> tff.Type:
  """The TFF type of `tff.learning.models.ModelWeights` for a FunctionalModel."""
  trainable, non_trainable = model.initial_weights
  spec = tff.learning.models.ModelWeights(
    tuple(tf.TensorSpec(w.shape, w.dtype) for w in trainable),
    tuple(tf.TensorSpec(w.shape, w.dtype) for w in non_trainable),
  )
  return tff.types.tensorflow_to_type(spec)


def _examples_and_index(rule: rule_lib.ClientRule, dataset) -> tuple[Any, tf.Tensor]:
  examples = local_loop.materialize(dataset)
  if rule.uses_client_index:
    return examples.example, examples.client_index[0]
  return examples, tf.constant(-1)


def build_local_client_work(
  rule: rule_lib.ClientRule,
  payload_type: tff.Type,
  options: client_round.ClientOptions,
) -> tff.learning.templates.ClientWorkProcess:
  """Client work running `rule` on each client's examples with `options`.

  Args:
    rule: the pure-TF client rule (its model gives the example type).
    payload_type: unplaced TFF type of what the server broadcasts to clients.
    options: local work and weighting (`ops.client_round.ClientOptions`).
  """
  hparams = collections.OrderedDict((k, np.float32(v)) for k, v in rule.initial_hparams().items())
  hparams_type = tff.types.tensorflow_to_type(
    collections.OrderedDict((k, tf.TensorSpec([], tf.float32)) for k in hparams)
  )
  element_type = example_type(rule.model)
  if rule.uses_client_index:
    element_type = tff.types.tensorflow_to_type(
      IndexedExample(
        client_index=tf.TensorSpec([], tf.int32),
        example=tff.types.type_to_tf_tensor_specs(element_type),
      )
    )
  data_type = tff.SequenceType(element_type)
  state_type = tff.types.tensorflow_to_type(
    client_round.ClientWorkState(
      hparams=tff.types.type_to_tf_tensor_specs(hparams_type), round=tf.TensorSpec([], tf.int32)
    )
  )

  def client_update_fn(payload, dataset, work_state, reference_loss):
    examples, index = _examples_and_index(rule, dataset)
    context = rule_lib.RoundContext.of(client_index=index, reference_loss=reference_loss)
    out = client_round.run_client(
      rule, payload, examples, work_state.hparams, context, options, work_state.round
    )
    return tff.learning.templates.ClientResult(out.update, out.weight), out.stats

  # Only rules that use the round's reference loss receive it (a broadcast saved).
  if rule.uses_reference_loss:

    @tff.tensorflow.computation(payload_type, data_type, state_type, tf.float32)
    def client_update(payload, dataset, work_state, reference_loss):
      return client_update_fn(payload, dataset, work_state, reference_loss)

  else:

    @tff.tensorflow.computation(payload_type, data_type, state_type)
    def client_update(payload, dataset, work_state):
      return client_update_fn(payload, dataset, work_state, 0.0)

  @tff.tensorflow.computation
  def finalize_stats(stats, reference_loss):
    return client_round.train_metrics(stats, reference_loss if rule.uses_reference_loss else None)

  @tff.federated_computation
  def init_fn():
    return tff.federated_value(client_round.ClientWorkState(hparams, np.int32(0)), tff.SERVER)

  @tff.tensorflow.computation(state_type)
  def next_round(state):
    return client_round.ClientWorkState(state.hparams, state.round + 1)

  @tff.tensorflow.computation(payload_type, data_type, state_type)
  def reference_value(payload, dataset, work_state):
    examples, _ = _examples_and_index(rule, dataset)
    return rule.reference_value(payload, examples, work_state.hparams)

  @tff.federated_computation(
    init_fn.type_signature.result,
    tff.FederatedType(payload_type, tff.CLIENTS),
    tff.FederatedType(data_type, tff.CLIENTS),
  )
  def next_fn(state, payload, data):
    client_state = tff.federated_broadcast(state)
    if rule.uses_reference_loss:
      # The round's common reference: the largest client loss at the broadcast model.
      reference = tff.federated_max(
        tff.federated_map(reference_value, (payload, data, client_state))
      )
      result, stats = tff.federated_map(
        client_update, (payload, data, client_state, tff.federated_broadcast(reference))
      )
    else:
      reference = tff.federated_value(np.float32(0.0), tff.SERVER)
      result, stats = tff.federated_map(client_update, (payload, data, client_state))
    measurements = tff.federated_map(finalize_stats, (tff.federated_sum(stats), reference))
    return tff.templates.MeasuredProcessOutput(
      tff.federated_map(next_round, state), result, measurements
    )

  @tff.tensorflow.computation(state_type)
  def get_hparams_fn(state):
    return state.hparams

  @tff.tensorflow.computation(state_type, hparams_type)
  def set_hparams_fn(state, new_hparams):
    return client_round.ClientWorkState(new_hparams, state.round)

  return tff.learning.templates.ClientWorkProcess(
    init_fn, next_fn, get_hparams_fn=get_hparams_fn, set_hparams_fn=set_hparams_fn
  )
