"""The in-process runtime: an `ops.algorithm.Algorithm` run directly in TensorFlow.

TFF's C++ worker pays a fixed cost per intrinsic and per client (about 1.8 ms per
client per round measured on the project's machines) and has no GPU build. This
runtime runs the same math layer (client rules through `ops.protocol.run_client`,
`ops.aggregation`, server rules) as one `tf.function` per round:

* client data stay resident on the device in variables (never constants captured in
  the graph): every client's examples concatenated, with each client's offset;
* a round's clients run vectorized (`tf.vectorized_map`) when every client holds the
  same number of examples, else by `tf.map_fn` with parallel iterations;
* aggregation, the server step and the round's metrics are computed in the same graph.

`InProcessProcess` mirrors a LearningProcess composed with client ids
(`initialize`, `next(state, client_ids)`, `get_model_weights`, `get_hparams`,
`set_hparams`, `get_personal_weights`), so the simulation loop drives either runtime,
and it gives the same results as the TFF process (parity tests per algorithm).
Device: the first GPU TensorFlow sees, else the CPU (`choose_device`), logged once.
"""

import collections
from collections.abc import Sequence
from typing import Any, NamedTuple

from absl import logging
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_comp.ops import aggregation
from tff_comp.ops import algorithm as algorithm_lib
from tff_comp.ops import local_loop
from tff_comp.ops import protocol
from tff_comp.ops import rule as rule_lib


class RoundOutput(NamedTuple):
  state: Any
  metrics: Any


class UnsupportedError(ValueError):
  """The process cannot run in-process; the message says why (use the TFF runtime)."""


def choose_device(logical_devices: Sequence[Any] | None = None) -> str:
  """The device name rounds run on: the first logical GPU, else the first CPU."""
  devices = (tf.config.list_logical_devices() if logical_devices is None
             else logical_devices)
  for kind in ('GPU', 'CPU'):
    for device in devices:
      if device.device_type == kind:
        return device.name
  raise RuntimeError('TensorFlow sees no CPU or GPU device.')


class ClientArrays(NamedTuple):
  """Every client's examples concatenated in client order (a structure of [total, ...]
  arrays; no padding, so heavy-tailed client sizes cost no memory), with the number of
  examples of each client."""

  examples: Any
  counts: np.ndarray
  client_ids: tuple[str, ...]


def client_arrays(client_data) -> ClientArrays:
  """All clients of a `tff.simulation.datasets.ClientData` as NumPy arrays."""
  ids = tuple(client_data.client_ids)
  per_client = []
  for cid in ids:  # each client's examples as one batch (iterating them is far slower)
    whole = local_loop.materialize(client_data.create_tf_dataset_for_client(cid))
    per_client.append(tf.nest.map_structure(np.asarray, whole))
  counts = np.array([len(tf.nest.flatten(c)[0]) for c in per_client], np.int32)
  examples = tf.nest.map_structure(lambda *a: np.concatenate(a), *per_client)
  return ClientArrays(examples, counts, ids)


def _specs_of(structure) -> Any:
  return tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape, t.dtype), structure)


class InProcessProcess:
  """Runs `algorithm` on `data` in this process; see the module docstring.

  Args:
    algorithm: the math to run (a composed process's `.algorithm`).
    data: the clients' examples (`client_arrays`).
    device: where to place data and rounds (default `choose_device()`).
    vectorize: 'auto' (when all clients hold equally many examples), True or False.
  """

  def __init__(self, algorithm: algorithm_lib.Algorithm, data: ClientArrays, *,
               device: str | None = None, vectorize: str | bool = 'auto'):
    self.algorithm = algorithm
    self.client_ids = data.client_ids
    self._index = {cid: i for i, cid in enumerate(data.client_ids)}
    self.device = device or choose_device()
    equal_sizes = bool(np.all(data.counts == data.counts[0]))
    if vectorize == 'auto':
      vectorize = equal_sizes
    elif vectorize and not equal_sizes:
      raise UnsupportedError('vectorize=True needs clients of equal sizes.')
    self.vectorized = bool(vectorize)
    logging.info('in-process runtime on %s (%s clients)', self.device,
                 'vectorized' if self.vectorized else 'mapped')
    with tf.device(self.device):
      self._examples = tf.nest.map_structure(
          lambda a: tf.Variable(a, trainable=False), data.examples)
      self._counts = tf.Variable(data.counts, trainable=False)
      self._offsets = tf.Variable((np.cumsum(data.counts) - data.counts).astype(np.int32),
                                  trainable=False)
    self._size = int(data.counts[0])  # every client's, when vectorized
    self._round = tf.function(self._round_fn)

  # --- state -------------------------------------------------------------------------

  def initialize(self) -> collections.OrderedDict:
    algorithm = self.algorithm
    trainable, non_trainable = algorithm.model.initial_weights
    with tf.device(self.device):
      weights = tff.learning.models.ModelWeights(
          tuple(tf.constant(w) for w in trainable),
          tuple(tf.constant(w) for w in non_trainable))
      server_state = algorithm.server_rule.reset(algorithm.server_rule.initialize(), weights)
      hparams = collections.OrderedDict(
          (k, tf.constant(v, tf.float32))
          for k, v in algorithm.client_rule.initial_hparams().items())
    return collections.OrderedDict(
        global_model_weights=weights, finalizer=server_state,
        client_work=collections.OrderedDict(hparams=hparams, round=tf.constant(0)))

  # Readers return NumPy values, as TFF's computations do.
  def get_model_weights(self, state):
    return tf.nest.map_structure(np.asarray, state['global_model_weights'])

  def set_model_weights(self, state, weights):
    new_state = collections.OrderedDict(state)
    new_state['global_model_weights'] = weights
    new_state['finalizer'] = self.algorithm.server_rule.reset(state['finalizer'], weights)
    return new_state

  def get_hparams(self, state) -> collections.OrderedDict:
    return tf.nest.map_structure(np.asarray, collections.OrderedDict(
        client_work=collections.OrderedDict(state['client_work']['hparams']),
        server_update=self.algorithm.server_rule.get_hparams(state['finalizer'])))

  def set_hparams(self, state, hparams):
    self.algorithm.client_rule.check_hparams(hparams['client_work'])
    new_state = collections.OrderedDict(state)
    new_state['client_work'] = collections.OrderedDict(
        hparams=collections.OrderedDict(
            (k, tf.constant(v, tf.float32)) for k, v in hparams['client_work'].items()),
        round=state['client_work']['round'])
    new_state['finalizer'] = self.algorithm.server_rule.set_hparams(
        state['finalizer'], hparams['server_update'])
    return new_state

  def get_personal_weights(self, state):
    return tf.nest.map_structure(
        np.asarray, self.algorithm.server_rule.personal_weights(state['finalizer']))

  # --- rounds ------------------------------------------------------------------------

  def next(self, state, client_ids: Sequence[str]) -> RoundOutput:
    """One round on the clients `client_ids` (distinct ids of the data)."""
    indices = tf.constant([self._index[cid] for cid in client_ids], tf.int32)
    # Tensors throughout (a Python float, such as a TFF optimizer's initial learning
    # rate, would make the round function trace again for the tensor it returns).
    state = tf.nest.map_structure(
        lambda v: tf.constant(v, tf.float32) if isinstance(v, float) else v, state)
    with tf.device(self.device):
      weights, server_state, metrics = self._round(
          state['global_model_weights'], state['finalizer'], state['client_work'], indices)
    work = state['client_work']
    new_state = collections.OrderedDict(
        global_model_weights=weights, finalizer=server_state,
        client_work=collections.OrderedDict(hparams=work['hparams'], round=work['round'] + 1))
    return RoundOutput(new_state, metrics)

  def _map_clients(self, fn, indices):
    """[fn(i, examples of client i) for i in indices], stacked on a leading axis."""
    if self.vectorized:  # equal sizes: the cohort's examples as one [m, n, ...] tensor
      cohort = tf.nest.map_structure(
          lambda v: tf.gather(tf.reshape(v, [-1, self._size, *v.shape[1:]]), indices),
          self._examples)
      return tf.vectorized_map(lambda args: fn(*args), (indices, cohort))

    def one(index):
      start, count = self._offsets[index], self._counts[index]
      return fn(index, tf.nest.map_structure(lambda v: v[start:start + count],
                                             self._examples))

    spec = _specs_of(tf.function(one).get_concrete_function(
        tf.TensorSpec([], tf.int32)).structured_outputs)
    return tf.map_fn(one, indices, fn_output_signature=spec,
                     parallel_iterations=int(indices.shape[0] or 10))

  def _round_fn(self, weights, server_state, work_state, indices):
    algorithm = self.algorithm
    rule, hparams = algorithm.client_rule, work_state['hparams']
    payload = algorithm.server_rule.payload(server_state, weights)
    reference = None
    if rule.uses_reference_loss:
      reference = tf.reduce_max(self._map_clients(
          lambda _, examples: rule.reference_value(payload, examples, hparams), indices))

    def client(index, examples):
      context = rule_lib.RoundContext.of(
          client_index=index, reference_loss=0.0 if reference is None else reference)
      return protocol.run_client(rule, payload, examples, hparams, context,
                                 algorithm.client_options, work_state['round'])

    outputs = self._map_clients(client, indices)
    update = aggregation.aggregate(algorithm.aggregation, outputs.update, outputs.weight)
    server_state, weights = algorithm.server_rule.step(server_state, weights, update)
    stats = tf.nest.map_structure(lambda s: tf.reduce_sum(s, axis=0), outputs.stats)
    metrics = collections.OrderedDict(
        distributor=(), client_work=protocol.train_metrics(stats, reference),
        aggregator=(), finalizer=())
    return weights, server_state, metrics


def build(process, client_data, **kwargs) -> InProcessProcess:
  """The in-process counterpart of a composed tff_comp process on `client_data`.

  Raises:
    UnsupportedError: the process has no Algorithm (hand-built blocks) or replaces the
      algorithm's aggregation with a custom TFF aggregator (clipping, DP, compression:
      those run on TFF's runtime only).
  """
  algorithm = getattr(process, 'algorithm', None)
  if algorithm is None:
    raise UnsupportedError('this process was composed from hand-built blocks, not an'
                           ' Algorithm; run it on the TFF runtime.')
  if getattr(process, 'custom_aggregator', False):
    raise UnsupportedError('a custom model_aggregator (TFF clipping, compression or DP)'
                           ' runs on the TFF runtime only.')
  return InProcessProcess(algorithm, client_arrays(client_data), **kwargs)
