"""Trials batched into one program: runs of one algorithm on one task that differ only in
values that keep every shape (learning rates and the client rule's other hyperparameters,
server-optimizer settings, `--seed`) run their rounds together, as one `tf.function`
on the in-process runtime.

Each trial is a run of its own, with its own loop, sampler, callbacks, checkpoints and
output directory (`tff_comp.trials.run_trials` starts each on a thread); its runtime is
a `TrialRuntime` whose `next` hands the round to the group and waits. When every trial
still running has handed over its next round, the last to arrive runs them all at once:

    the states stacked on a trial axis [T]; the cohorts concatenated, each client
      tagged with its trial t(i)
    P_t = server_rule.payload(S_t, W_t)                           (per trial)
    client i's round on the engine, from P_t(i) and the hparams of trial t(i), its
      batches shuffled by trial t(i)'s seed and round; the cohort ordered by client,
      so the trials sampling a client step on it in lanes side by side (batched)
    (W_t', S_t', A_t', metrics_t) = the aggregation of trial t's clients (with a private
      aggregator's state A_t and noise seeded by trial t's seed), the server step and
      the metrics: `stages.RoundStages.finish`              (per trial)

"Per trial" runs a separate run's own ops on its own shapes in a loop over trials, and
each client's work is its own whatever lane it runs in, so every trial's numbers are
those of its separate run to the bit (`tests/test_trials.py`, every registered
algorithm). A trial that ends (its rounds done, diverged, stopped) leaves the group;
the others go on, its slot kept with no clients. Why threads: a trial's loop,
callbacks and run directory are the single run's code, unchanged; only its rounds (and
its evaluations, `together`) meet, and between rounds the loops take turns
(`rendezvous.Rendezvous`, the group's base).
"""

from collections.abc import Callable, Mapping, Sequence
import time
from typing import Any, NamedTuple, Protocol

import numpy as np
import tensorflow as tf

from tff_comp.ops import client_round
from tff_comp.runtime import base, learning_state, nested, traced
from tff_comp.runtime.inprocess import engine_interface, rendezvous


def _host(value: Any) -> np.ndarray | np.generic:
  """A state's leaf in NumPy, in the dtype `learning_state.as_tensors` gives it (a Python
  float as float32, an int as int32), so the round is traced once."""
  # Exact types: NumPy's float64 scalars (a state read back from a round) are floats too.
  if type(value) is float:
    return np.float32(value)
  if type(value) is int:
    return np.int32(value)
  return np.asarray(value)


class _Rows:
  """A structure of stacked leaves ([T, ...]) split into each trial's row, packed by a
  `nested.Packer` (a group splits every trial's state every round)."""

  def __init__(self, packer: nested.Packer, stacked: Any):
    self._packer, self._leaves = packer, tf.nest.flatten(stacked)

  def __getitem__(self, t: int) -> Any:
    return self._packer.pack([leaf[t] for leaf in self._leaves])


# A trial's round as it hands it to the group: its state, cohort and each client's share
# of the work (None: whole).
_Round = tuple[base.State, list[str], Sequence[float] | None]


class TrialClients(NamedTuple):
  """Where a trial's clients are in the group's data: under the ids `prefix` + the
  trial's own, each one's row of per-client server state being its index in the
  trial's own population (`population_index`)."""

  prefix: str
  population_index: Mapping[str, int]


class GroupRuntime(base.Runtime, Protocol):
  """What a group of trials needs of the runtime it batches (the in-process runtime,
  `inprocess.InProcessRuntime`, which makes groups of itself: `trial_group`)."""

  algorithm: Any
  stages: Any  # stages.RoundStages
  data: Any  # resident_data.ResidentData
  device: str
  engine: str
  streaming: bool

  @property
  def engine_impl(self) -> Any: ...  # the engine_interface.Engine running its cohorts

  @property
  def population_index(self) -> Mapping[str, int]: ...

  def note_cohort(self, size: int) -> None:
    """Tells the engine the size of the first cohort its kernel is traced for."""


def why_not(runtime: GroupRuntime) -> str:
  """Why a group cannot hold `runtime`'s trials yet ('' when it can)."""
  if runtime.streaming:
    return 'streamed client data run one trial at a time'
  if not runtime.engine_impl.in_graph:
    return f'the {runtime.engine} engine runs one trial at a time'
  return ''


class TrialGroup(rendezvous.Rendezvous[_Round]):
  """`size` trials of `runtime`'s algorithm on its data (see the module docstring);
  `seeds[t]`: trial t's seed of shuffling and epoch draws (its `--seed`); `clients[t]`:
  where trial t's clients are (None: every trial's are the runtime's own clients).

  Raises:
    base.UnsupportedError: what a batch of trials cannot hold yet (streamed data, an
      engine outside the graph); the caller runs those trials one by one.
  """

  def __init__(
    self, runtime: GroupRuntime, seeds: Sequence[int], clients: Sequence[TrialClients] | None = None
  ):
    reason = why_not(runtime)
    if reason:
      raise base.UnsupportedError(reason)
    super().__init__(len(seeds))
    self.runtime = runtime
    self._clients = clients or [TrialClients('', runtime.population_index)] * self.size
    self._seeds = tf.constant(seeds, tf.int64)
    self._round_fn = traced.OnceTraced(self._round)
    self._dtypes: Any = None  # (model, server, aggregator state) leaves' dtypes, as
    # the round returns them
    self._packers: dict[str, nested.Packer] = {}  # by part of the state (`_packer`)
    self._reserved = [0] * self.size  # each trial's largest cohort
    self._capacity = 0  # clients of the compiled round (the trials' cohorts together)
    self._last: dict[int, base.State] = {}  # each trial's latest state (an empty slot's)
    self.rounds_run = 0  # batched rounds
    # Seconds in the compiled round function, its outputs on the host, in the rounds
    # after the first (which compiles it): the floor of the group's time.
    self.round_seconds = 0.0
    self.retraces = 0  # rounds after the first that traced the round again (a bug)

  def member(self, t: int, initial: base.State | None = None) -> 'TrialRuntime':
    """Trial `t`'s runtime, starting from `initial` (None: the runtime's initial state;
    a trial on its own task's data starts from its task's model)."""
    return TrialRuntime(self, t, initial)

  def reserve(self, t: int, size: int) -> None:
    with self._lock:
      self._reserved[t] = max(self._reserved[t], size)

  def submit(
    self, t: int, state: base.State, client_ids: Sequence[str], work: Sequence[float] | None
  ) -> base.RoundOutput:
    """Trial `t`'s round; returns when the group has run it."""
    return self.meet(t, (state, list(client_ids), work))

  def _run(self, batch: dict[int, _Round]) -> dict[int, Any]:
    """The trials' rounds as one: states stacked and split on the host in NumPy (one
    conversion a leaf, not one eager op a leaf and trial)."""
    runtime = self.runtime
    self._last.update({t: state for t, (state, _, _) in batch.items()})
    states, positions, indices, work, trial = [], [], [], [], []
    for t in range(self.size):
      state, cohort, share = batch.get(t, (self._last.get(t), [], None))
      if state is None:  # a trial that left before its first round: any state will do
        state = next(iter(self._last.values()))
      states.append(state)
      prefix, population_index = self._clients[t]
      positions += [runtime.data.index[prefix + c] for c in cohort]
      indices += [population_index[c] for c in cohort]
      work += [1.0] * len(cohort) if share is None else list(share)
      trial += [t] * len(cohort)
    stacked = self._stack(states)
    # Compiled for every trial's largest cohort together, so once (as a single run's).
    self._capacity = max(self._capacity, sum(self._reserved), len(positions))
    if not self._round_fn.traced(self._capacity):  # one trace for cohorts of every size
      runtime.note_cohort(len(positions))
      self._trace(stacked)
    stacked = self._in_round_dtypes(stacked)
    args = self._args(stacked)[:5]
    traces = self._round_fn.function.experimental_get_tracing_count()
    # The clients in the kernel by their position in the data (the trials sampling a
    # client side by side, so their lanes read its batches together), their outputs
    # back in trial order (`restore`) for each trial's aggregation.
    order = np.lexsort((np.arange(len(positions)), positions))
    restore = np.argsort(order)
    positions, indices, work, trial_in_kernel = (
      np.asarray(v)[order] for v in (positions, indices, work, trial)
    )
    started = time.perf_counter()
    with tf.device(runtime.device):
      new = self._round_fn(
        self._capacity,
        *args,
        tf.constant(positions, tf.int32),
        tf.constant(indices, tf.int32),
        tf.constant(work, tf.float32),
        tf.constant(trial_in_kernel, tf.int32),
        tf.constant(restore, tf.int32),
        tf.constant(trial, tf.int32),
        self._capacity,
      )
    *parts, packed = tf.nest.map_structure(lambda t: t.numpy(), new)
    if self.rounds_run:
      self.round_seconds += time.perf_counter() - started
    weights, server, aggregator, hparams = (
      _Rows(self._packer(name, part), part)
      for name, part in zip(
        ('weights', 'server', 'aggregator', 'hparams'), (*parts, stacked.client_work.hparams)
      )
    )
    if self.rounds_run and self._round_fn.function.experimental_get_tracing_count() != traces:
      self.retraces += 1
    self.rounds_run += 1
    outputs = {}
    for t in batch:
      work_state = client_round.ClientWorkState(
        hparams[t], np.int32(stacked.client_work.round[t] + 1)
      )
      outputs[t] = base.RoundOutput(
        learning_state.assemble(weights[t], work_state, server[t], aggregator[t]),
        runtime.stages.unpack_metrics(packed[t]),
      )
    return outputs

  def _packer(self, name: str, structure: Any) -> nested.Packer:
    """The packer of the state's part `name` for `structure` (made again if the part's
    structure changed: hparams a callback added, say)."""
    packer = self._packers.get(name)
    try:
      if packer is not None:
        tf.nest.assert_same_structure(packer.structure, structure, check_types=True)
        return packer
    except (TypeError, ValueError):
      pass
    self._packers[name] = nested.Packer(structure)
    return self._packers[name]

  def _stack(self, states: list[base.State]) -> base.State:
    """The trials' states stacked leaf by leaf (on the host, in NumPy: one conversion a
    leaf, not one eager op a leaf and trial)."""
    leaves = [tf.nest.flatten(state) for state in states]
    packer = self._packer('state', states[0])
    if any(len(own) != packer.size for own in leaves):
      raise ValueError("the trials' states differ in structure.")
    return packer.pack([np.stack([_host(v) for v in leaf]) for leaf in zip(*leaves)])

  def _args(self, stacked: base.State) -> tuple[Any, ...]:
    """The round function's arguments for any cohort: the stacked states' parts, the
    seeds and the shapes of the per-client inputs."""
    return (
      stacked.global_model_weights,
      stacked.finalizer,
      client_round.ClientWorkState(*stacked.client_work),
      stacked.aggregator,
      self._seeds,
      tf.TensorSpec([None], tf.int32),
      tf.TensorSpec([None], tf.int32),
      tf.TensorSpec([None], tf.float32),
      tf.TensorSpec([None], tf.int32),
      tf.TensorSpec([None], tf.int32),
      tf.TensorSpec([None], tf.int32),
      self._capacity,
    )

  def _trace(self, stacked: base.State) -> None:
    """Traces the round for the group's capacity, its model and server state in the
    dtypes the round returns them (`_dtypes`): a trial's first state may hold a leaf in
    another (a server rate set as float64, returned as float32), which would trace the
    round again, and compile its kernel again, in round 2."""
    returned = self._round_fn.trace(self._capacity, *self._args(stacked)).structured_outputs
    self._dtypes = tf.nest.map_structure(lambda t: t.dtype.as_numpy_dtype, returned[:3])
    cast = self._in_round_dtypes(stacked)
    if any(a.dtype != b.dtype for a, b in zip(tf.nest.flatten(stacked), tf.nest.flatten(cast))):
      self._round_fn.trace(self._capacity, *self._args(cast))

  def _in_round_dtypes(self, stacked: base.State) -> base.State:
    weights, server, aggregator = tf.nest.map_structure(
      lambda v, dtype: v.astype(dtype, copy=False),
      (stacked.global_model_weights, stacked.finalizer, stacked.aggregator),
      self._dtypes,
    )
    return stacked._replace(global_model_weights=weights, finalizer=server, aggregator=aggregator)

  def _round(
    self,
    weights,
    server_state,
    work_state,
    aggregator,
    seeds,
    positions,
    indices,
    work,
    trial,
    restore,
    trial_order,
    capacity: int,
  ):
    """One round of every trial (states stacked on axis 0); clients, in the kernel's
    order, tagged by `trial`; their outputs put back in the trials' order by `restore`,
    tagged there by `trial_order`. What a trial's separate round computes from its own
    state runs per trial (`tf.map_fn`), with the same ops on the same shapes, so its
    numbers are the same to the bit; only the clients' work is batched."""
    runtime = self.runtime
    server_rule, hparams = runtime.algorithm.server_rule, work_state.hparams
    payload = _per_trial(server_rule.payload, server_state, weights)
    plans, reference = runtime.stages.client_plans(
      payload,
      hparams,
      positions,
      indices,
      work,
      work_state.round,
      seeds,
      trial=trial,
      trials=self.size,
    )
    outputs = runtime.engine_impl.run(
      engine_interface.Cohort(
        payload,
        hparams,
        positions,
        tf.gather(runtime.data.offsets, positions),
        tf.gather(runtime.data.counts, positions),
        plans,
        capacity,
        trial,
      )
    )
    outputs = tf.nest.map_structure(lambda x: tf.gather(x, restore), outputs)
    indices = tf.gather(indices, restore)
    trial = trial_order

    def finish(t, weights, server_state, aggregator, round_num, seed, *reference):
      own = tf.reshape(tf.where(tf.equal(trial, t)), [-1])  # trial t's clients, in order
      return runtime.stages.finish(
        tf.nest.map_structure(lambda x: tf.gather(x, own), outputs),
        weights,
        server_state,
        aggregator,
        round_num,
        seed,
        *(reference or [None]),
        tf.gather(indices, own),
      )

    return _per_trial(
      finish,
      tf.range(self.size),
      weights,
      server_state,
      aggregator,
      work_state.round,
      seeds,
      *([] if reference is None else [reference]),
    )


def _per_trial(fn, *stacked) -> Any:
  """fn(row t of each of `stacked`) for every trial t, stacked: a loop (`tf.map_fn`),
  not a vectorization, so each trial runs a separate run's ops on its shapes."""
  spec = tf.nest.map_structure(
    lambda t: tf.TensorSpec(t.shape, t.dtype),
    tf.function(fn, autograph=False)
    .get_concrete_function(
      *tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape[1:], t.dtype), stacked)
    )
    .structured_outputs,
  )
  return tf.map_fn(lambda rows: fn(*rows), stacked, fn_output_signature=spec)


class TrialRuntime:
  """One trial's runtime (`runtime.base.Runtime`): the group's in-process runtime for
  everything but `next`, which runs in the group's batched round."""

  def __init__(self, group: TrialGroup, t: int, initial: base.State | None = None):
    self._group, self._t, self._inner, self._initial = group, t, group.runtime, initial
    self.name = self._inner.name
    self.keeps_personal_models = self._inner.keeps_personal_models
    self.partial_work = True
    self.sampler = None

  @property
  def description(self) -> str:
    return f'{self._inner.description}, {self._group.size} trials batched'

  @property
  def record(self) -> dict[str, Any]:
    return dict(self._inner.record, trials=self._group.size)

  def initialize(self) -> base.State:
    return self._inner.initialize() if self._initial is None else self._initial

  def next(
    self, state: base.State, client_ids: Sequence[str], work: Sequence[float] | None = None
  ) -> base.RoundOutput:
    if not client_ids:
      raise ValueError('a round needs at least one client.')
    return self._group.submit(self._t, state, client_ids, work)

  def reserve_cohort(self, size: int) -> None:
    self._group.reserve(self._t, size)

  def together(self, item: Any, run: Callable[[list[Any]], list[Any]]) -> Any:
    """`TrialGroup.together` for this trial."""
    return self._group.together(self._t, item, run)

  def prefetch(self, client_ids: Sequence[str]) -> None:
    del client_ids  # resident data only

  def leave(self) -> None:
    self._group.leave(self._t)

  def get_model_weights(self, state: base.State) -> Any:
    return self._inner.get_model_weights(state)

  def get_hparams(self, state: base.State) -> Any:
    return self._inner.get_hparams(state)

  def set_hparams(self, state: base.State, hparams: Any) -> base.State:
    return self._inner.set_hparams(state, hparams)

  def get_personal_weights(self, state: base.State) -> Any:
    return self._inner.get_personal_weights(state)

  def whole_state(self, state: base.State) -> base.State:
    return state
