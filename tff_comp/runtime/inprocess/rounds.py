"""The in-process runtime's rounds (`InProcessRuntime`; `runtime.inprocess` builds and
registers it): an `ops.algorithm.Algorithm` run directly in TensorFlow, one
`tf.function` a round; see `runtime.inprocess`'s docstring."""

import collections
from collections.abc import Callable, Sequence
import copy
from typing import Any

from absl import logging
import numpy as np
import tensorflow as tf

from tff_comp import data as data_lib
from tff_comp import native_logs
from tff_comp.ops import algorithm as algorithm_lib
from tff_comp.ops import client_round, local_loop
from tff_comp.runtime import base, error_text, learning_state, traced
from tff_comp.runtime.inprocess import engine_interface, resident_data, stages, streaming
from tff_comp.runtime.inprocess import engines as engines_lib
from tff_comp.runtime.inprocess import trials as inprocess_trials

UnsupportedError = base.UnsupportedError
choose_device = resident_data.choose_device
ENGINES = ('auto', *engines_lib.ENGINES)
# A cohort's positions, population indices and work, traced for cohorts of every size.
_ANY_SIZE = (
  tf.TensorSpec([None], tf.int32),
  tf.TensorSpec([None], tf.int32),
  tf.TensorSpec([None], tf.float32),
)


class InProcessRuntime:
  """Runs `algorithm` on `data` in this process; see the module docstring.

  Args:
    algorithm: the math to run.
    data: the clients' examples (`client_arrays`).
    device: where to place data and rounds (default `choose_device()`).
    engine: 'lanes', 'mapped', 'debug' (`runtime.inprocess.engines`) or 'auto': lanes, unless the
      algorithm's local step would be slow under XLA here (a decomposition on a CPU)
      or fails to vectorize in the first round, then mapped; the
      choice and its reason are logged in one line (`engine`, `why`, `record`).
    lanes: clients stepping together on the lanes engine (default 8 on a CPU, where
      wider lanes were no faster per step, 64 on a GPU; by default a kernel may take up
      to twice that where its cohorts then run in fewer lane-steps and its first cohort
      fills it: `engines.LanesEngine.width`).
    client_rounds: the client rounds of the whole run (rounds x clients per round), if
      known; 'auto' takes the mapped engine when their local steps are too few to
      repay compiling the lanes kernel (`engines.AUTO_LANES_MIN_STEPS`).
    kernel_threads: the lanes engine's cohort runs as that many kernels side by side,
      one a thread (`resident_data.kernel_threads`; None: one a core this process may use).

  Cohorts may have any size: the lanes kernel holds `capacity` clients (padded with
  clients of no steps) and compiles again only when a cohort exceeds it
  (`reserve_cohort` sets it ahead; else it is the largest cohort so far).
  """

  name = 'inprocess'
  partial_work = True
  sampler = None
  _chain_start: Any = None  # the chain's state its runs start from (`starting_chain_at`)

  def __init__(
    self,
    algorithm: algorithm_lib.Algorithm,
    data: data_lib.ClientArrays | streaming.StreamedData,
    *,
    device: str | None = None,
    engine: str = 'auto',
    lanes: int | None = None,
    client_rounds: int | None = None,
    why_streaming: str = '',
    kernel_threads: int | None = None,
  ):
    if engine not in ENGINES:
      raise ValueError(f'engine={engine!r} is unknown; choose one of {list(ENGINES)}.')
    if lanes is not None and lanes < 1:
      raise ValueError(f'lanes must be >= 1, got {lanes}.')
    self.algorithm = algorithm
    self.client_ids = data.client_ids
    # A client's index in the population (RoundContext.client_index: its row of
    # per-client server state), apart from its position in the data on the device,
    # which differs when the data are streamed.
    self.population_index = {cid: i for i, cid in enumerate(data.client_ids)}
    self.device = device or choose_device()
    self.keeps_personal_models = algorithm.server_rule.keeps_personal_models
    rule, options = algorithm.client_rule, algorithm.client_options
    self.streaming = isinstance(data, streaming.StreamedData)
    self.data: resident_data.ResidentData = (
      data
      if isinstance(data, streaming.StreamedData)
      else resident_data.ResidentData(
        data.examples, data.counts, data.client_ids, self.device, with_keys=options.uses_client_key
      )
    )
    # The short last batches' sizes: a client's remainder does not depend on the round
    # (fixed epochs; drawn epochs and fixed steps have none).
    batches = client_round.plan_cohort(rule, options, self.data.counts, self.data.keys, 0)
    remainders = batches.remainder.numpy()
    short_sizes = tuple(int(s) for s in np.unique(remainders[remainders > 0]))
    self.stages = stages.RoundStages(algorithm, self.data)
    self.capacity = 0  # clients the lanes kernel holds (0: none compiled yet)
    self.lanes = lanes or (64 if 'GPU' in self.device.upper() else 8)
    self.kernel_threads = resident_data.kernel_threads(self.device, kernel_threads or 0)
    self._engines = {
      name: engine_(
        algorithm,
        self.data,
        lanes=self.lanes,
        threads=self.kernel_threads,
        short_sizes=short_sizes,
        full_batches=None if lanes else batches.full.numpy(),
      )
      for name, engine_ in engines_lib.ENGINES.items()
    }
    # Traced once for cohorts of any size (see `next`); without AutoGraph, which
    # tff_comp's math does not need and which tripled the time of the first round.
    self._round_fn = traced.OnceTraced(self._round)
    # A round's clients alone (`client_outputs`), traced once per capacity.
    self._clients_fn = traced.OnceTraced(self._client_outputs)
    # Their sums (`client_sums`), traced on first use.
    self._sums_fn: Callable[..., Any] | None = None
    self._candidates_fn = tf.function(
      lambda payload, hparams, positions: self.stages.reference_candidates(
        payload, hparams, positions
      ),
      autograph=False,
      reduce_retracing=True,
    )
    self._fallbacks: list[str] = []  # the engines 'auto' falls back to if a round fails
    self._whole_work: dict[int, tf.Tensor] = {}  # `_cohort`'s, by cohort size
    self._weights_reader = learning_state.WeightsReader()  # `get_model_weights`
    # Why the engine is not auto's first choice (or the data are streamed).
    self.why = (why_streaming or "streaming each cohort's data") if self.streaming else ''
    if engine != 'auto':
      if self.streaming and self._engines[engine].compiles_per_capacity:
        raise UnsupportedError(
          f'the {engine} engine needs resident data (it compiles for'
          " the data's shape); stream with another engine."
        )
      self.engine = engine
    else:
      self.engine = self._choose(batches, client_rounds)
    logging.info('in-process runtime: %s', self.description)

  def _choose(self, batches: local_loop.BatchPlan, client_rounds: int | None) -> str:
    """'auto''s engine: the first of `engines.AUTO_ORDER` that can read the data and
    whose `why_not` is empty; the reason for passing over the first in `why`."""
    algorithm, reasons = self.algorithm, []
    state = self.initialize()
    payload = algorithm.server_rule.payload(state.finalizer, state.global_model_weights)
    run_steps = (
      None if client_rounds is None else int(client_rounds * np.mean(batches.steps.numpy()))
    )
    for i, engine in enumerate(engines_lib.AUTO_ORDER):
      if self.streaming and engine.compiles_per_capacity:
        reasons.append(self.why)
        continue
      reason = engine.why_not(
        algorithm, self.data.examples, self.device, payload, state.client_work.hparams, run_steps
      )
      if not reason:
        self.why = reasons[0] if reasons else ''
        self._fallbacks = [e.name for e in engines_lib.AUTO_ORDER[i + 1 :]]
        return engine.name
      reasons.append(reason)
    raise AssertionError('unreachable: the last engine of AUTO_ORDER runs every rule')

  @property
  def description(self) -> str:
    why = f' ({self.why})' if self.why else ''
    threads = (
      f' on {self.kernel_threads} threads'
      if self.engine == 'lanes' and self.kernel_threads > 1
      else ''
    )
    return f'inprocess on {self.device}, {self.engine} engine{threads}{why}'

  @property
  def record(self) -> dict[str, Any]:
    return {
      'name': self.name,
      'device': self.device,
      'engine': self.engine,
      'why': self.why,
      'data': 'streaming' if self.streaming else 'resident',
      'kernel_threads': self.kernel_threads,
      'huge_pages': not self.streaming and self.data.huge_pages,
    }

  # --- state -------------------------------------------------------------------------

  def initialize(self) -> base.State:
    state = learning_state.initial_state(self.algorithm, self.device, len(self.client_ids))
    if self._chain_start is not None:
      state = learning_state.with_chain_state(state, self._chain_start)
    return state

  def starting_chain_at(self, chain_state: Any) -> 'InProcessRuntime':
    started = copy.copy(self)  # its compiled round shared
    started._chain_start = chain_state
    return started

  # Readers return NumPy values, as TFF's computations do (`learning_state`).
  def get_model_weights(self, state: base.State):
    return self._weights_reader(state)

  def set_model_weights(self, state: base.State, weights) -> base.State:
    return learning_state.with_model_weights(self.algorithm, state, weights)

  def get_hparams(self, state: base.State) -> collections.OrderedDict:
    return learning_state.hparams(self.algorithm, state)

  def set_hparams(self, state: base.State, hparams) -> base.State:
    return learning_state.with_hparams(self.algorithm, state, hparams)

  def get_personal_weights(self, state: base.State):
    return tf.nest.map_structure(
      np.asarray, self.algorithm.server_rule.personal_weights(state.finalizer)
    )

  def whole_state(self, state: base.State) -> base.State:
    return state

  def why_not_batched(self) -> str:
    """`base.BatchesTrials`: why its trials run one at a time ('' when batched)."""
    return inprocess_trials.why_not(self)

  def trial_group(
    self, seeds: Sequence[int], clients: Sequence[inprocess_trials.TrialClients] | None = None
  ) -> inprocess_trials.TrialGroup:
    """`base.BatchesTrials`: a group of trials of its algorithm on its data."""
    return inprocess_trials.TrialGroup(self, seeds, clients)

  # --- rounds ------------------------------------------------------------------------

  def prefetch(self, client_ids: Sequence[str]) -> None:
    """Streaming: starts reading the next round's clients while this one runs."""
    if isinstance(self.data, streaming.StreamedData):
      self.data.prefetch(client_ids)

  def reserve_cohort(self, size: int) -> None:
    """Lets the lanes kernel hold cohorts of up to `size` clients (compiled once)."""
    self.capacity = max(self.capacity, size)

  def next(
    self, state: base.State, client_ids: Sequence[str], work: Sequence[float] | None = None
  ) -> base.RoundOutput:
    """One round on the clients `client_ids` (at least one; an id given twice runs
    twice), each doing the fraction `work` of its local steps (None: all)."""
    if not client_ids:
      raise ValueError('a round needs at least one client.')
    if work is not None and len(work) != len(client_ids):
      raise ValueError(f'work has {len(work)} entries for {len(client_ids)} clients.')
    positions, work = self._cohort(client_ids, work)
    # Resident data hold the population in its order: a client's position is its index.
    indices = (
      positions
      if not self.streaming
      else tf.constant([self.population_index[cid] for cid in client_ids], tf.int32)
    )
    state = learning_state.as_tensors(state)
    args = (
      state.global_model_weights,
      state.finalizer,
      client_round.ClientWorkState(*state.client_work),
      state.aggregator,
    )
    with tf.device(self.device):
      try:
        weights, server_state, aggregator, metrics, round_num = self._run_round(
          args, positions, indices, work
        )
      except (tf.errors.OpError, ValueError, TypeError, NotImplementedError) as error:
        if not self._fallbacks:
          raise
        # A rule XLA or vectorization cannot run (the round is pure: nothing to undo).
        self._fall_back(error)
        weights, server_state, aggregator, metrics, round_num = self._run_round(
          args, positions, indices, work
        )
    self._fallbacks = []  # a later failure is the algorithm's own, not the engine's
    next_work = client_round.ClientWorkState(state.client_work.hparams, round_num)
    return base.RoundOutput(
      learning_state.assemble(weights, next_work, server_state, aggregator),
      self.stages.unpack_metrics(metrics),
    )

  def _cohort(
    self, client_ids: Sequence[str], work: Sequence[float] | None
  ) -> tuple[tf.Tensor, tf.Tensor]:
    """(positions of the clients' examples in `self.data`, their work): their data
    loaded where streamed, the lanes kernel's capacity grown to hold them."""
    if isinstance(self.data, streaming.StreamedData):
      self.data.load(client_ids)
    positions = tf.constant([self.data.index[cid] for cid in client_ids], tf.int32)
    if work is not None:
      work = tf.constant(work, tf.float32)
    else:  # every client's whole work: one tensor per cohort size, made once
      work = self._whole_work.get(len(client_ids))
      if work is None:
        work = self._whole_work[len(client_ids)] = tf.ones([len(client_ids)])
    if len(client_ids) > self.capacity:
      if self.capacity and self.engine_impl.compiles_per_capacity:
        logging.info(
          'in-process runtime: a cohort of %d clients exceeds the %s'
          " kernel's %d; compiling it for %d.",
          len(client_ids),
          self.engine,
          self.capacity,
          len(client_ids),
        )
      self.capacity = len(client_ids)
    return positions, work

  def _run_round(
    self, args: tuple[Any, Any, Any, Any], positions: tf.Tensor, indices: tf.Tensor, work: tf.Tensor
  ):
    # Only an engine compiling per capacity (lanes) has a compiled cohort shape: the
    # others take 0, so a larger cohort does not trace their round again.
    engine = self.engine_impl
    capacity = self.capacity if engine.compiles_per_capacity else 0
    if not engine.in_graph:
      return self._round(*args, positions, indices, work, capacity)
    key = (self.engine, capacity)
    if not self._round_fn.traced(key):
      # One trace for cohorts of every size: later calls bind to its [None] shapes.
      self.note_cohort(int(positions.shape[0]))
      self._round_fn.trace(key, *args, *_ANY_SIZE, capacity)
      with native_logs.filtered_stderr(native_logs.XLA_NOTICES):  # its first compile
        return self._round_fn(key, *args, positions, indices, work, capacity)
    return self._round_fn(key, *args, positions, indices, work, capacity)

  def _fall_back(self, error: Exception) -> None:
    op = error_text.failing_op(error)
    rule = type(self.algorithm.client_rule).__name__
    failed, self.engine = self.engine, self._fallbacks.pop(0)
    self.why = f"{failed} cannot run {rule}'s local step" + (
      f' (op {op} does not vectorize or compile)' if op else f' ({type(error).__name__})'
    )
    logging.warning('in-process runtime: %s; clients run %s.', self.why, self.engine)

  def _round(
    self, weights, server_state, work_state, aggregator, positions, indices, work, capacity: int
  ):
    """One round; `positions` locate the cohort's examples in `self.data`, `indices`
    are the clients' indices in the population. Returns (weights, server state,
    aggregator state, packed metrics, the next round's number): the number counted
    here, not by an eager add after the round."""
    algorithm, hparams = self.algorithm, work_state.hparams
    payload = algorithm.server_rule.payload(server_state, weights)
    seed = algorithm.client_options.seed
    outputs, reference = self._client_outputs(
      payload, hparams, positions, indices, work, work_state.round, None, capacity
    )
    return (
      *self.stages.finish(
        outputs,
        weights,
        server_state,
        aggregator,
        work_state.round,
        seed,
        reference,
        indices,
        capacity or None,  # 0: an engine without a compiled cohort shape
      ),
      work_state.round + 1,
    )

  def _client_outputs(
    self, payload, hparams, positions, indices, work, round_num, reference, capacity: int
  ):
    """(the cohort's ClientOutput, the round's reference loss): its clients' work."""
    rule, engine = self.algorithm.client_rule, self.engine_impl
    seed = self.algorithm.client_options.seed
    if engine.plans_in_kernel and not (rule.uses_reference_loss or rule.uses_start_loss):

      def plan(positions, indices, work):  # in the lanes kernel, on its padded rows
        return self.stages.client_plans(
          payload, hparams, positions, indices, work, round_num, seed
        )[0]

      return engine.run(
        engine_interface.Cohort(
          payload,
          hparams,
          positions,
          None,
          None,
          engine_interface.DeferredPlans(indices, work, plan),
          capacity,
        )
      ), None
    plans, reference = self.stages.client_plans(
      payload, hparams, positions, indices, work, round_num, seed, reference=reference
    )
    return engine.run(
      engine_interface.Cohort(
        payload,
        hparams,
        positions,
        tf.gather(self.data.offsets, positions),
        tf.gather(self.data.counts, positions),
        plans,
        capacity,
      )
    ), reference

  # --- a round's clients alone (its aggregation elsewhere: `runtime.ray`) ----

  def client_outputs(
    self,
    payload,
    hparams,
    client_ids: Sequence[str],
    work: Sequence[float],
    indices: Sequence[int],
    round_num: int,
    reference: float | None = None,
  ) -> client_round.ClientOutput:
    """The clients' `ClientOutput`s in NumPy, stacked in the order of `client_ids`, from
    the round's `payload` and `hparams`: a round's clients, whose aggregation runs
    elsewhere. `indices`: their rows of per-client state (their index in the whole
    population); `reference`: the whole cohort's reference loss (rules with
    `uses_reference_loss`). Each client's numbers are those of the whole round's."""
    return tf.nest.map_structure(
      np.asarray, self._outputs(payload, hparams, client_ids, work, indices, round_num, reference)
    )

  def _outputs(self, payload, hparams, client_ids, work, indices, round_num, reference):
    """`client_outputs` as tensors on the device."""
    positions, work_ = self._cohort(client_ids, work)
    capacity = self.capacity if self.engine_impl.compiles_per_capacity else 0
    reference = tf.constant(0.0 if reference is None else reference, tf.float32)
    args = (tf.constant(indices, tf.int32), work_, tf.constant(round_num), reference, capacity)
    if not self.engine_impl.in_graph:
      return self._client_outputs(payload, hparams, positions, *args)[0]
    if not self._clients_fn.traced(capacity):
      self.note_cohort(len(client_ids))
      self._clients_fn.trace(capacity, payload, hparams, *_ANY_SIZE, *args[2:])
    with tf.device(self.device):
      outputs, _ = self._clients_fn(capacity, payload, hparams, positions, *args)
    return outputs

  def client_sums(
    self,
    payload,
    hparams,
    client_ids: Sequence[str],
    work: Sequence[float],
    indices: Sequence[int],
    round_num: int,
    reference: float | None,
    aggregator,
  ) -> stages.RoundSums:
    """`client_outputs` summed for the round's end (`RoundStages.sums`, with the
    aggregator chain's state `aggregator`), in NumPy: what a share of a cohort sends,
    whatever its number of clients (a chain needing every row: their encoded rows).
    The outputs stay on the device for the sums."""
    outputs = self._outputs(payload, hparams, client_ids, work, indices, round_num, reference)
    indices = tf.constant(indices, tf.int32)
    round_num = tf.constant(round_num, tf.int32)
    seed = self.algorithm.client_options.seed
    if self._sums_fn is None:  # one trace for shares of every size
      self._sums_fn = tf.function(
        lambda o, a, i, r: self.stages.sums(o, a, i, r, seed), autograph=False
      ).get_concrete_function(
        tf.nest.map_structure(lambda o: tf.TensorSpec([None, *o.shape[1:]], o.dtype), outputs),
        tf.nest.map_structure(
          lambda a: tf.TensorSpec(np.shape(a), tf.as_dtype(np.asarray(a).dtype)), aggregator
        ),
        tf.TensorSpec([None], tf.int32),
        tf.TensorSpec([], tf.int32),
      )
    with tf.device(self.device):
      return tf.nest.map_structure(
        np.asarray, self._sums_fn(outputs, aggregator, indices, round_num)
      )

  def reference_candidates(self, payload, hparams, client_ids: Sequence[str]) -> np.ndarray:
    """The clients' candidates for the round's reference loss (its cohort split across
    runtimes: the largest is the reference)."""
    positions, _ = self._cohort(client_ids, None)
    with tf.device(self.device):
      return self._candidates_fn(payload, hparams, positions).numpy()

  def note_cohort(self, size: int) -> None:
    """Tells the lanes engine the size of the first cohort its kernel is traced for
    (`engines.LanesEngine.width`)."""
    if self.engine_impl.compiles_per_capacity:
      self.engine_impl.note_cohort(size)

  @property
  def engine_impl(self) -> Any:
    """The engine object running the cohorts (`runtime.inprocess.engines`)."""
    return self._engines[self.engine]
