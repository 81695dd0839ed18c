"""An `ops.aggregators.Chain` placed as a `tff.aggregators` factory: the same math the
in-process runtimes run, on TFF's runtime and in any TFF process a researcher composes.

    clients:  x_i (the model part, flattened) -> the chain's encodes -> y_i, counts
    sum:      a decomposable combiner's sums (tff.federated_sum), or every row gathered
              (tff.federated_aggregate concatenating rows, as TFF's reservoir sampling
              does) for a combiner that needs them (median, Krum, ...)
    server:   the combiner, then the stages' decodes; the update in the value's structure

The server state is the chain's state and the round number. Randomness is stateless: the
round's seed is (seed, round); a client's, (seed, round, a hash of its update), since TFF's
clients are anonymous (the in-process runtimes use the client's index instead, so
stochastic stages draw other numbers there). What TFF cannot hold is refused in one line
when the factory is built: a stage keeping rows per client (error feedback: TFF's clients
keep no state between rounds) or reading the whole cohort (ALIE's attack).
"""

import collections
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_comp.ops import aggregators


def why_not(chain: aggregators.Chain) -> str:
  """Why TFF's runtime cannot run `chain` ('' when it can)."""
  if chain.bind(1).row_size:  # bound: a stage's rows are sized by the model's
    return (
      f'aggregator {chain.name} keeps a row per client (error feedback, worker momentum),'
      " which TFF's stateless clients cannot hold; run it in-process"
    )
  if chain.by_client:
    return (
      f'aggregator {chain.name} follows each client across rounds (a fixed set of'
      " attackers), which TFF's anonymous clients cannot give; run it in-process"
    )
  if chain.cohort_wide:
    return (
      f"aggregator {chain.name} reads the whole cohort in a client's encoding (ALIE),"
      ' which TFF places on each client alone; run it in-process'
    )
  return ''


def _size(value_type: tff.Type) -> int:
  return sum(
    int(np.prod(t.shape))
    for t in tff.structure.flatten(value_type)
    if isinstance(t, tff.TensorType)
  )


def _like(value_type: tff.Type) -> Any:
  """Zeros in the structure of `value_type` (a template for `unflatten`)."""
  return tff.types.type_to_tf_tensor_specs(value_type)


class ChainFactory(tff.aggregators.WeightedAggregationFactory):
  """A `Chain` as a weighted `tff.aggregators` factory (see the module docstring);
  an unweighted chain (a robust combiner) ignores the weights, as in-process."""

  def __init__(self, chain: aggregators.Chain, seed: int = 0):
    reason = why_not(chain)
    if reason:
      raise ValueError(reason + '.')
    self._chain, self._seed = chain, seed

  def create(self, value_type, weight_type) -> tff.templates.AggregationProcess:
    chain = self._chain.bind(_size(value_type))
    like, seed = _like(value_type), self._seed

    @tff.tensorflow.computation
    def initial():
      return collections.OrderedDict(chain=chain.initial_state(), round=tf.constant(0, tf.int64))

    state_type = initial.type_signature.result

    @tff.tensorflow.computation(value_type, weight_type, state_type)
    def encode(value, weight, state):
      x = aggregators.flatten(tf.nest.map_structure(lambda t: t[tf.newaxis], value))
      fingerprint = tf.strings.to_hash_bucket_fast(tf.io.serialize_tensor(x), 2**62)
      seeds = aggregators.client_seeds(seed, state['round'], fingerprint[tf.newaxis])
      weights = tf.reshape(tf.cast(weight, tf.float32), [1])
      encoded = chain.encode(state['chain'], x, weights, tf.zeros([1, 0]), seeds)
      return collections.OrderedDict(chain.sums(state['chain'], encoded)._asdict())

    sums_type = encode.type_signature.result
    total, total_type = (
      (tff.federated_sum, sums_type) if chain.decomposable else _gathered(sums_type)
    )

    @tff.tensorflow.computation(state_type, total_type)
    def finish(state, summed):
      update, new_chain, measured = chain.finish(
        state['chain'],
        aggregators.Sums(**summed),
        aggregators.round_seed(seed, state['round']),
      )
      new_state = collections.OrderedDict(chain=new_chain, round=state['round'] + 1)
      return new_state, aggregators.unflatten(update, like), measured

    @tff.federated_computation
    def init_fn():
      return tff.federated_eval(initial, tff.SERVER)

    @tff.federated_computation(
      init_fn.type_signature.result,
      tff.FederatedType(value_type, tff.CLIENTS),
      tff.FederatedType(weight_type, tff.CLIENTS),
    )
    def next_fn(state, value, weight):
      sums = tff.federated_map(encode, (value, weight, tff.federated_broadcast(state)))
      new_state, update, measured = tff.federated_map(finish, (state, total(sums)))
      return tff.templates.MeasuredProcessOutput(new_state, update, measured)

    return tff.templates.AggregationProcess(init_fn, next_fn)


def _gathered(sums_type: tff.Type) -> tuple[Callable[[Any], Any], tff.Type]:
  """(total, its result's type) for a combiner needing every row: the clients' rows
  concatenated (an accumulator of unknown leading size, as TFF's reservoir sampling
  keeps), the other fields added."""
  # The fields of rows (every one but an absent `marks`), each of any number of rows.
  rows = {
    name: tff.TensorType(np.float32, [None, *sums_type[name].shape[1:]])
    for name in aggregators.ROW_FIELDS
    if isinstance(sums_type[name], tff.TensorType)
  }
  added = [name for name in aggregators.Sums._fields if name not in rows]
  acc_type = tff.to_type(
    collections.OrderedDict(**rows, **{name: sums_type[name] for name in added})
  )

  def merged(a, b):
    out = collections.OrderedDict((name, tf.concat([a[name], b[name]], 0)) for name in rows)
    out.update((name, tf.nest.map_structure(tf.add, a[name], b[name])) for name in added)
    return out

  @tff.tensorflow.computation
  def zero():
    specs = tff.types.type_to_tf_tensor_specs(sums_type)
    out = collections.OrderedDict(
      (name, tf.zeros([0, *sums_type[name].shape[1:]])) for name in rows
    )
    out.update(
      (name, tf.nest.map_structure(lambda s: tf.zeros(s.shape, s.dtype), specs[name]))
      for name in added
    )
    return out

  accumulate = tff.tensorflow.computation(merged, acc_type, sums_type)
  merge = tff.tensorflow.computation(merged, acc_type, acc_type)
  report = tff.tensorflow.computation(lambda acc: acc, acc_type)

  def total(sums):
    return tff.federated_aggregate(sums, zero(), accumulate, merge, report)

  return total, acc_type
