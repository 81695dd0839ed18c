"""The in-process runtime: an `ops.algorithm.Algorithm` run directly in TensorFlow.

TFF's C++ worker pays a fixed cost per intrinsic and per client (about 1.8 ms per
client per round measured on the project's machines) and has no GPU build. This
runtime runs the same math layer (the client protocol of `ops.protocol`,
`ops.aggregation`, server rules) as one `tf.function` per round:

* client data stay resident on the device in variables (never constants captured in
  the graph): every client's examples concatenated, with each client's offset;
* the cohort's local steps run in lockstep lanes compiled by XLA (`runtime.lanes`),
  or, for rules XLA cannot compile or runs slowly (`InProcessProcess`'s `engine`),
  client by client with `tf.map_fn`;
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
from tff_comp.runtime import lanes as lanes_lib


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


ENGINES = ('auto', 'lanes', 'mapped')
# Decompositions XLA runs as slow iterative loops on a CPU: with the nuclear-norm prox
# (an SVD per local step) a FedDualAvg round took 290 ms on lanes, 20 ms mapped.
# A step with second-order autodiff (Per-FedAvg's exact variant, the compositional MAML
# objectives) also runs mapped: under `tf.vectorized_map` its gradient-of-gradient
# shape computations made XLA take the cohort as a compile-time constant (XLA's
# const_analysis log), about 1 s of compiling every round on sinewave.
_SLOW_UNDER_XLA_ON_CPU = frozenset({'Svd', 'Qr', 'SelfAdjointEigV2', 'Eig', 'MatrixSolve',
                                    'MatrixInverse', 'Cholesky'})


class InProcessProcess:
  """Runs `algorithm` on `data` in this process; see the module docstring.

  Args:
    algorithm: the math to run (a composed process's `.algorithm`).
    data: the clients' examples (`client_arrays`).
    device: where to place data and rounds (default `choose_device()`).
    engine: 'lanes' (`runtime.lanes` compiled by XLA), 'mapped' (clients by
      `tf.map_fn`, no XLA) or 'auto': lanes, unless the algorithm's rules do not
      compile with XLA or would be slow there (a decomposition on a CPU, second-order
      autodiff), then mapped (logged with the reason; `self.engine`, `self.why`).
    lanes: clients stepping together on the lanes engine (default 8 on a CPU, where
      wider lanes were no faster per step, 64 on a GPU).
  """

  def __init__(self, algorithm: algorithm_lib.Algorithm, data: ClientArrays, *,
               device: str | None = None, engine: str = 'auto', lanes: int | None = None):
    if engine not in ENGINES:
      raise ValueError(f'engine={engine!r} is unknown; choose one of {list(ENGINES)}.')
    if lanes is not None and lanes < 1:
      raise ValueError(f'lanes must be >= 1, got {lanes}.')
    self.algorithm = algorithm
    self.client_ids = data.client_ids
    self._index = {cid: i for i, cid in enumerate(data.client_ids)}
    self.device = device or choose_device()
    self.engine = 'lanes' if engine == 'auto' else engine
    self._fallback = engine == 'auto'
    self.why = ''  # why the engine is not lanes, when auto chose otherwise
    self._short_batches = _has_short_batches(algorithm, data.counts)
    self.lanes = lanes or (64 if 'GPU' in self.device.upper() else 8)
    with tf.device(self.device):
      self._examples = tf.nest.map_structure(
          lambda a: tf.Variable(a, trainable=False), data.examples)
      self._counts = tf.Variable(data.counts, trainable=False)
      self._offsets = tf.Variable((np.cumsum(data.counts) - data.counts).astype(np.int32),
                                  trainable=False)
    self._rounds = {'lanes': tf.function(self._lanes_round),
                    'mapped': tf.function(self._mapped_round)}
    self._cohort = tf.function(self._run_cohort, jit_compile=True)
    if self._fallback:
      self.why = self._why_not_lanes()
      if self.why:
        self.engine, self._fallback = 'mapped', False
    logging.info('in-process runtime on %s (%s engine%s)', self.device, self.engine,
                 f': {self.why}' if self.why else '')

  def _why_not_lanes(self) -> str:
    """Why the lanes engine would be slow for this algorithm here, or ''."""
    nodes = self._step_nodes()
    slow = {op for _, op in nodes} & _SLOW_UNDER_XLA_ON_CPU
    if slow and 'CPU' in self.device.upper():
      return f'its local step runs {", ".join(sorted(slow))}, slow under XLA on a CPU'
    # TensorFlow names the ops of a gradient of a gradient 'gradients/gradients/...'.
    if any('gradients/gradients/' in name for name, _ in nodes):
      return ('its local step differentiates a gradient (second-order autodiff), which'
              ' makes XLA compile the lanes kernel again for every cohort')
    return ''

  def _step_nodes(self) -> set[tuple[str, str]]:
    """(name, op type) of the ops of one local step of the client rule (nested
    functions included)."""
    algorithm = self.algorithm
    rule, state = algorithm.client_rule, self.initialize()
    payload = algorithm.server_rule.payload(state['finalizer'], state['global_model_weights'])
    hparams = state['client_work']['hparams']
    size = protocol.step_batch_size(rule, algorithm.client_options)
    batch = tf.nest.map_structure(lambda v: v[:size], self._examples)
    context = rule_lib.RoundContext.of(client_index=0)
    graph = tf.function(lambda: rule.step(
        rule.initialize(payload, hparams, context), batch, payload, hparams,
        context)).get_concrete_function().graph.as_graph_def()
    return ({(node.name, node.op) for node in graph.node}
            | {(node.name, node.op) for f in graph.library.function for node in f.node_def})

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
    args = (state['global_model_weights'], state['finalizer'], state['client_work'],
            indices)
    with tf.device(self.device):
      try:
        weights, server_state, metrics = self._rounds[self.engine](*args)
      except (tf.errors.OpError, ValueError, TypeError, NotImplementedError) as error:
        if not self._fallback or self.engine != 'lanes':
          raise
        # A rule XLA or vectorization cannot run (the round is pure: nothing to undo).
        logging.warning('lanes engine unavailable for this algorithm (%s); clients run'
                        ' mapped instead.', str(error).strip().splitlines()[-1][:300])
        self.engine, self._fallback = 'mapped', False
        weights, server_state, metrics = self._rounds[self.engine](*args)
    self._fallback = False  # a later failure is the algorithm's own, not the engine's
    work = state['client_work']
    new_state = collections.OrderedDict(
        global_model_weights=weights, finalizer=server_state,
        client_work=collections.OrderedDict(hparams=work['hparams'], round=work['round'] + 1))
    return RoundOutput(new_state, metrics)

  def _client_examples(self, index):
    start, count = self._offsets[index], self._counts[index]
    return tf.nest.map_structure(lambda v: v[start:start + count], self._examples)

  def _map_clients(self, fn, indices):
    """[fn(i, examples of client i) for i in indices], stacked on a leading axis."""

    def one(index):
      return fn(index, self._client_examples(index))

    spec = _specs_of(tf.function(one).get_concrete_function(
        tf.TensorSpec([], tf.int32)).structured_outputs)
    return tf.map_fn(one, indices, fn_output_signature=spec,
                     parallel_iterations=int(indices.shape[0] or 10))

  def _reference(self, payload, hparams, indices):
    """The round's reference loss (the largest of the clients' candidates), or None."""
    rule = self.algorithm.client_rule
    if not rule.uses_reference_loss:
      return None
    return tf.reduce_max(self._map_clients(
        lambda _, examples: rule.reference_value(payload, examples, hparams), indices))

  def _plans(self, payload, work_state, indices, reference) -> protocol.ClientPlan:
    """The cohort's ClientPlans, stacked: computed per client only where a plan reads
    the client's examples (start loss, epoch draws), else from the counts."""
    rule, options = self.algorithm.client_rule, self.algorithm.client_options
    reference = 0.0 if reference is None else reference
    if rule.uses_start_loss or options.local_epochs_max is not None:
      return self._map_clients(
          lambda index, examples: protocol.plan_client(
              rule, payload, examples, work_state['hparams'],
              rule_lib.RoundContext.of(client_index=index, reference_loss=reference),
              options, work_state['round']), indices)
    m = indices.shape[0]
    full, remainder = local_loop.schedule(
        tf.gather(self._counts, indices), batch_size=protocol.step_batch_size(rule, options),
        epochs=options.local_epochs, steps=options.local_steps)
    context = rule_lib.RoundContext(indices, tf.fill([m], tf.cast(reference, tf.float32)),
                                    tf.zeros([m]))
    return protocol.ClientPlan(context, full, remainder)

  def _run_cohort(self, payload, hparams, offsets, counts, plans):
    algorithm = self.algorithm
    return lanes_lib.run_full_batches(
        algorithm.client_rule, payload, hparams, algorithm.client_options, self._examples,
        offsets, counts, plans, lanes=self.lanes)

  def _lanes_round(self, weights, server_state, work_state, indices):
    algorithm, hparams = self.algorithm, work_state['hparams']
    rule, options = algorithm.client_rule, algorithm.client_options
    payload = algorithm.server_rule.payload(server_state, weights)
    reference = self._reference(payload, hparams, indices)
    plans = self._plans(payload, work_state, indices, reference)
    offsets, counts = tf.gather(self._offsets, indices), tf.gather(self._counts, indices)
    states = self._cohort(payload, hparams, offsets, counts, plans)  # compiled by XLA
    if self._short_batches:
      states = lanes_lib.run_short_batches(rule, payload, hparams, options, self._examples,
                                           offsets, counts, plans, states)
    outputs = lanes_lib.finish_cohort(rule, payload, hparams, options, counts, plans, states)
    return self._finish_round(weights, server_state, outputs, reference)

  def _mapped_round(self, weights, server_state, work_state, indices):
    algorithm = self.algorithm
    payload = algorithm.server_rule.payload(server_state, weights)
    reference = self._reference(payload, work_state['hparams'], indices)

    def client(index, examples):
      context = rule_lib.RoundContext.of(
          client_index=index, reference_loss=0.0 if reference is None else reference)
      return protocol.run_client(algorithm.client_rule, payload, examples,
                                 work_state['hparams'], context, algorithm.client_options,
                                 work_state['round'])

    return self._finish_round(weights, server_state, self._map_clients(client, indices),
                              reference)

  def _finish_round(self, weights, server_state, outputs, reference):
    """Aggregation, the server step and the round's metrics from stacked outputs."""
    algorithm = self.algorithm
    update = aggregation.aggregate(algorithm.aggregation, outputs.update, outputs.weight)
    server_state, weights = algorithm.server_rule.step(server_state, weights, update)
    stats = tf.nest.map_structure(lambda s: tf.reduce_sum(s, axis=0), outputs.stats)
    metrics = collections.OrderedDict(
        distributor=(), client_work=protocol.train_metrics(stats, reference),
        aggregator=aggregation.measurements(algorithm.aggregation, outputs.update,
                                            outputs.weight) or (),
        finalizer=())
    return weights, server_state, metrics


def _has_short_batches(algorithm: algorithm_lib.Algorithm, counts: np.ndarray) -> bool:
  """Whether some client's round on these data ends with a short batch."""
  options = algorithm.client_options
  if options.local_steps is not None or options.local_epochs_max is not None:
    return False  # whole batches only (cycling, or FedNova's floor(E n / B))
  size = protocol.step_batch_size(algorithm.client_rule, options)
  return bool(np.any(options.local_epochs * counts % size))


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
  _check_runs_outside_tff(algorithm.model)
  return InProcessProcess(algorithm, client_arrays(client_data), **kwargs)


def _check_runs_outside_tff(model) -> None:
  """UnsupportedError for a model from `tff.learning.models.functional_model_from_keras`,
  which raises when called from eager code (outside a TFF computation or a graph). TFF
  does not export that error's class (KerasFunctionalModelError), so it is recognized
  by name. The check traces once per model on purpose, so TensorFlow's warning about
  frequent retracing (after a few builds in one process) is silenced while it runs."""
  x_spec = model.input_spec[0]
  x = tf.zeros([1, *x_spec.shape[1:]], x_spec.dtype)
  logger = tf.get_logger()
  level = logger.level
  logger.setLevel('ERROR')
  try:
    tf.function(lambda: model.predict_on_batch(model.initial_weights, x))()
  except Exception as error:  # pylint: disable=broad-except
    if type(error).__name__ == 'KerasFunctionalModelError':
      raise UnsupportedError('a Keras model converted by TFF runs inside TFF'
                             ' computations only; run it on the TFF runtime.') from error
    raise
  finally:
    logger.setLevel(level)
