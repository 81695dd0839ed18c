"""Buffered asynchronous aggregation (FedBuff; Nguyen et al., AISTATS 2022) on the
in-process runtime, in simulated time.

`--concurrency=C` clients train at once. A client starts from the server's model in
force when it is dispatched and reports t_i simulated seconds later (its device time,
`run.devices`; one second each without a device model). Each arrival enters the
server's buffer; after `--buffer_size=K` arrivals the server steps:

    x_{t+1} = server_rule(x_t, sum_{i in B} w_i s(tau_i) Delta_i / sum_{i in B} w_i)

Delta_i is client i's update computed from x_{v_i}, the model it started with; its
staleness tau_i = t - v_i; w_i its aggregation weight (examples); s the staleness
weight, 1 (`--staleness=constant`) or 1 / sqrt(1 + tau) (`poly`, the paper's). An
arrival staler than `--max_staleness` is dropped (counted, not in B). Each arrival
frees a slot: a new client is dispatched at once, with the model in force after the
arrivals of that instant (all arrivals at one instant enter the buffer, in dispatch
order, before their replacements start). Clients are dispatched in the order of the
run's uniform sampler's draws of K clients, round r's after round r - 1's
(`--clients_per_round` is not used), so with C = K and equal device times every step
is a synchronous round of K clients.

The schedule (who arrives at which step, from which model, at what time) depends on
the seed and the devices only, not on the model, and is replayed from the start
(`async_schedule.Schedule`). A client's update depends only on the model it starts from,
its data and its start version (its round number for shuffling), so the clients
dispatched while x_t is in force run together, as one cohort on the runtime's engine,
when step t + 1 begins (`BufferedAsyncRuntime`); their updates wait for their arrival
(at most C of them held, in host memory).

Algorithms: those whose clients send a model delta averaged by the weighted mean with
no per-client server state and no round-wide reference (`why_not`); others are
refused in one line. Every field of an arrival's update is weighted by s (FedDualAvg's
step-size sum with its dual delta). An aggregator chain (`ops.aggregators`: clipping,
zeroing, compression, a secure sum, a robust combiner, attackers) takes the model part
of the step's arrivals in place of the weighted mean, each arrival weighted by s before
its encoding: a client learns its staleness when it uploads and scales its update
itself, as a secure sum needs (the server sees only the buffer's total). Refused: DP
noise (its accounting counts sampled rounds) and error feedback (a client in flight
twice would overwrite its residual). The updates in flight and the chain's state are
the aggregator's state (`InFlight`), so checkpoints hold them and `--resume` continues
exactly.
"""

from collections.abc import Sequence
import copy
import dataclasses
import math
from typing import Any, NamedTuple, NoReturn, Protocol, runtime_checkable

import numpy as np
import tensorflow as tf

from tff_comp import settings
from tff_comp.ops import update_aggregation
from tff_comp.run import async_schedule, devices, sampling
from tff_comp.runtime import base, learning_state
from tff_comp.runtime.inprocess import stages
from tff_comp.settings import ConfigError

MODES = ('sync', 'async')
STALENESS = ('constant', 'poly')


_ASYNC = {'mode': ('async',)}  # the settings that only buffered async reads


@dataclasses.dataclass(frozen=True)
class AsyncOptions:
  """Synchronous rounds or buffered asynchronous steps (module docstring)."""

  mode: str = settings.setting(
    'sync',
    'sync: rounds of --clients_per_round clients; async: buffered asynchronous'
    ' aggregation (FedBuff), a server step after every --buffer_size arrivals of'
    ' --concurrency clients training at once (--rounds counts server steps).',
    choices=MODES,
  )
  concurrency: int = settings.setting(
    10,
    'Async: clients training at once.',
    lower=1,
    upper=settings.MAX_COUNT,
    applies_when=_ASYNC,
  )
  buffer_size: int = settings.setting(
    10,
    'Async: arrivals per server step.',
    lower=1,
    upper=settings.MAX_COUNT,
    applies_when=_ASYNC,
  )
  staleness: str = settings.setting(
    'poly',
    'Async: the weight of an update s steps stale: constant (1) or poly (1/sqrt(1+s), as FedBuff).',
    choices=STALENESS,
    applies_when=_ASYNC,
  )
  max_staleness: int | None = settings.setting(
    None,
    'Async: drop updates more than this many steps stale (None: keep all).',
    lower=0,
    upper=settings.MAX_COUNT,
    applies_when=_ASYNC,
  )

  def __post_init__(self):
    settings.check(self)

  def weight(self, staleness: int) -> float:
    return 1.0 if self.staleness == 'constant' else 1.0 / math.sqrt(1.0 + staleness)


def why_not(algorithm) -> str:
  """Why buffered async cannot run `algorithm` ('' when it can)."""
  if algorithm is None:
    return 'the program is not a registered algorithm'
  rule = algorithm.client_rule
  if algorithm.aggregation != update_aggregation.MEAN:
    return f'its updates are aggregated as {algorithm.aggregation.name}, not a weighted mean'
  chain = algorithm.model_chain
  if algorithm.model_aggregator is not None and chain is None:
    return "its model aggregator is a TFF factory, which runs on TFF's runtime"
  if chain is not None and any(getattr(s, 'private', False) for s in chain.stages):
    return (
      "DP's accounting counts sampled rounds, and a buffer's arrivals are not one"
      ' (clip without noise: --aggregator=clip)'
    )
  if chain is not None and chain.row_size:
    return (
      f'the aggregator {chain.name} keeps a row per client (error feedback, worker momentum),'
      ' which a client in flight twice would overwrite'
    )
  if rule.uses_client_index or algorithm.server_rule.keeps_personal_models:
    return 'it keeps per-client state on the server'
  if rule.uses_reference_loss:
    return 'its clients need a round-wide reference loss'
  return ''


class InFlight(NamedTuple):
  """The buffered aggregator's state: the updates computed and not yet arrived, as
  rows of fixed shape (at most C: `concurrency`), so a checkpoint holds them and a
  resumed run continues exactly. `seq`: each row's dispatch number (-1: empty);
  `outputs`: the clients' `ClientOutput`s stacked; `chain`: the driver's aggregator
  state (an aggregator chain's: an adaptive clip norm, a rotation's seed; () without)."""

  seq: np.ndarray
  outputs: Any
  chain: Any


@runtime_checkable
class Driver(base.Runtime, base.ClientOutputs, base.StartsChains, Protocol):
  """What buffered asynchronous steps run their clients on: a runtime giving each
  client's outputs, starting chains from a trial's state, whose model weights can be
  set (a resume's). The in-process runtime is one."""

  def set_model_weights(self, state: base.State, weights: Any) -> base.State:
    """`state` with the global model `weights`."""

  def starting_chain_at(self, chain_state: Any) -> 'Driver':
    """As `base.StartsChains`, a driver again."""


class BufferedAsyncRuntime:
  """Server steps of the module docstring on an in-process runtime (`driver`), one per
  `next`, which takes the clients of `schedule.plan(t).cohort` (its `sampler` hands
  them to the loop). The state is the driver's, with the updates in flight as its
  aggregator state (`InFlight`)."""

  name = 'inprocess'
  partial_work = False

  def __init__(self, driver: Driver, schedule: async_schedule.Schedule, options: AsyncOptions):
    self._driver, self.schedule, self.options = driver, schedule, options
    self.algorithm = driver.algorithm
    self.keeps_personal_models = False
    self.sampler = AsyncSampler(schedule, options)  # the loop's
    driver.reserve_cohort(self.sampler.capacity)
    self._host = stages.HostFinish(driver.stages, driver.device)
    self._empty: InFlight | None = None

  @property
  def driver(self) -> Driver:
    """The runtime running the clients (the in-process one)."""
    return self._driver

  @property
  def description(self) -> str:
    o = self.options
    return (
      f'buffered async (concurrency {o.concurrency}, buffer {o.buffer_size},'
      f' {o.staleness} staleness) on {self._driver.description}'
    )

  @property
  def record(self) -> dict[str, Any]:
    return dict(self._driver.record, mode='async')

  def initialize(self) -> base.State:
    state = self._driver.initialize()
    if self._empty is None:  # the rows' shapes: one client's output
      client = self.schedule.plan(1).cohort[0][1]
      one = self._run_clients(state, [client], 0)
      self._empty = InFlight(
        np.full(self.options.concurrency, -1, np.int64),
        tf.nest.map_structure(
          lambda a: np.zeros((self.options.concurrency, *a.shape[1:]), a.dtype), one
        ),
        (),
      )
    return self._with_flight(state, self._empty._replace(chain=state.aggregator))

  def starting_chain_at(self, chain_state: Any) -> 'BufferedAsyncRuntime':
    started = copy.copy(self)  # its schedule and sampler shared
    started._driver = self._driver.starting_chain_at(chain_state)
    return started

  def _with_flight(self, state: base.State, flight: InFlight) -> base.State:
    return learning_state.assemble(
      state.global_model_weights, state.client_work, state.finalizer, flight
    )

  def get_model_weights(self, state: base.State):
    return self._driver.get_model_weights(state)

  def set_model_weights(self, state: base.State, weights) -> base.State:
    return self._with_flight(self._driver.set_model_weights(state, weights), state.aggregator)

  def get_hparams(self, state: base.State):
    return self._driver.get_hparams(state)

  def set_hparams(self, state: base.State, hparams) -> base.State:
    return self._with_flight(self._driver.set_hparams(state, hparams), state.aggregator)

  def get_personal_weights(self, state: base.State):
    return self._driver.get_personal_weights(state)

  def whole_state(self, state: base.State) -> base.State:
    return state

  def prefetch(self, client_ids: Sequence[str]) -> None:
    self._driver.prefetch(client_ids)

  def reserve_cohort(self, size: int) -> None:
    self._driver.reserve_cohort(size)

  def _run_clients(self, state: base.State, client_ids: Sequence[str], version: int):
    """The clients' outputs (NumPy, stacked) from `state`'s model, as dispatched while
    version `version` was in force (their round number: shuffling, client keys)."""
    return self._driver.client_outputs(
      self._host.payload(state),
      tf.nest.map_structure(np.asarray, state.client_work.hparams),
      client_ids,
      [1.0] * len(client_ids),
      [self._driver.population_index[c] for c in client_ids],
      version,
    )

  def next(
    self, state: base.State, client_ids: Sequence[str], work: Sequence[float] | None = None
  ) -> base.RoundOutput:
    """Server step t + 1 (t: the steps done): runs the clients dispatched from x_t
    (`client_ids`, the plan's cohort), then aggregates the step's arrivals."""
    state = learning_state.as_tensors(state)
    step = int(state.client_work.round) + 1
    plan = self.schedule.plan(step)
    if list(client_ids) != [c for _, c in plan.cohort] or work is not None:
      raise ValueError(f"step {step}: the clients given are not the schedule's cohort.")
    flight = tf.nest.map_structure(np.asarray, state.aggregator)
    waiting = {
      int(seq): tf.nest.map_structure(lambda a, i=i: a[i], flight.outputs)
      for i, seq in enumerate(flight.seq)
      if seq >= 0
    }
    if plan.cohort:  # none when steps come at one instant: nobody started between
      outputs = self._run_clients(state, client_ids, step - 1)
      for i, (seq, _) in enumerate(plan.cohort):
        waiting[seq] = tf.nest.map_structure(lambda a, i=i: a[i], outputs)
    arrived = [waiting.pop(a.seq) for a in plan.arrivals]
    for late in plan.dropped:
      del waiting[late.seq]
    factors = np.array([self.options.weight(s) for s in plan.staleness], np.float32)
    outputs = tf.nest.map_structure(lambda *a: np.stack(a), *arrived)
    outputs = outputs._replace(
      update=tf.nest.map_structure(
        lambda u: u * factors.reshape([-1] + [1] * (u.ndim - 1)), outputs.update
      )
    )
    indices = [self._driver.population_index[a.client] for a in plan.arrivals]
    weights, server, chain, metrics = self._host(outputs, state, flight.chain, None, indices)
    work_state = type(state.client_work)(state.client_work.hparams, state.client_work.round + 1)
    metrics = self._driver.stages.unpack_metrics(metrics)
    staleness = np.array(plan.staleness, np.float64)
    metrics['async'] = dict(
      arrivals=float(len(plan.arrivals)),
      dropped=float(len(plan.dropped)),
      staleness_mean=float(staleness.mean()),
      staleness_max=float(staleness.max()),
    )
    return base.RoundOutput(
      learning_state.assemble(weights, work_state, server, self._pack(waiting, flight, chain)),
      metrics,
    )

  def _pack(self, waiting: dict[int, Any], like: InFlight, chain: Any) -> InFlight:
    """`waiting` in `InFlight`'s fixed rows (`like`'s shapes), with the aggregator
    state `chain`."""
    seqs = sorted(waiting)
    if len(seqs) > len(like.seq):
      raise AssertionError(f'{len(seqs)} updates in flight exceed the concurrency')
    seq = np.full_like(like.seq, -1)
    seq[: len(seqs)] = seqs
    outputs = tf.nest.map_structure(np.zeros_like, like.outputs)
    for i, key in enumerate(seqs):
      for row, value in zip(tf.nest.flatten(outputs), tf.nest.flatten(waiting[key])):
        row[i] = value
    return InFlight(seq, outputs, chain)


class AsyncSampler:
  """The loop's sampler for buffered async: step t's "round" is the cohort dispatched
  from x_{t-1}; its time is the step's simulated clock."""

  def __init__(self, schedule: async_schedule.Schedule, options: AsyncOptions):
    self._schedule = schedule
    # The largest cohort: the first (C clients, then up to K - 1 replacements).
    self.capacity = options.concurrency + options.buffer_size - 1

  def sample(self, round_num: int) -> sampling.RoundClients:
    plan = self._schedule.plan(round_num)
    before = self._schedule.plan(round_num - 1).clock if round_num > 1 else 0.0
    ids = tuple(c for _, c in plan.cohort)
    return sampling.RoundClients(
      ids, ids, None, len(plan.dropped), plan.clock - before, plan.clock, steps=True
    )


# Built-in runtimes that give no client's own outputs (`base.ClientOutputs`): async is
# refused on them before they start (a local Ray cluster takes half a minute to start).
_WHOLE_ROUND_RUNTIMES = ('tff', 'ray')


def check(config, client_data, algorithm, runtimes: Sequence[str] = ()) -> None:
  """Raises ConfigError (one line), before any runtime is built, for an async run
  (`config`: its `experiment_config.ExperimentConfig`) that cannot be: on the built-in
  `runtimes` (`choice.candidates`; () when built) none of which gives each client's outputs, an
  algorithm it cannot run (`why_not`), a sampling other than uniform, dropout or
  stragglers, a deadline or over-selection, more clients at once than the task has."""
  if runtimes and all(name in _WHOLE_ROUND_RUNTIMES for name in runtimes):
    _refuse_runtime(runtimes[0])
  reason = why_not(algorithm)
  if reason:
    raise ConfigError(f'--mode=async cannot run this algorithm: {reason}.')
  participation, options = config.participation, config.asynchrony
  if (
    participation.sampling != 'uniform'
    or participation.dropout_rate
    or participation.straggler_rate
  ):
    raise ConfigError(
      '--mode=async draws clients uniformly (--sampling=uniform) and models'
      ' no dropout or stragglers: the device times decide who reports when.'
    )
  if config.devices.round_deadline is not None or config.devices.overselect > 1:
    raise ConfigError(
      "--round_deadline and --overselect are synchronous rounds' settings;"
      ' with --mode=async use --max_staleness.'
    )
  clients = len(client_data.client_ids)
  if max(options.concurrency, options.buffer_size) > clients:
    raise ConfigError(
      f'--concurrency={options.concurrency} and --buffer_size='
      f"{options.buffer_size} may not exceed the task's {clients}"
      ' clients.'
    )


def _refuse_runtime(name: str) -> NoReturn:
  raise ConfigError(
    "--mode=async runs on the in-process runtime (a runtime giving each client's"
    f' outputs), not {name}.'
  )


def for_run(config, runtime, client_data, algorithm) -> BufferedAsyncRuntime:
  """The async runtime (its `sampler` the loop's) over a run's in-process `runtime`;
  `config`: the run's `experiment_config.ExperimentConfig` (seed, participation, devices,
  asynchrony, resume), `check`ed before `runtime` was built.

  Raises:
    ConfigError: (one line) `runtime` gives no client's outputs (a plugin's).
  """
  if not isinstance(runtime, Driver):
    _refuse_runtime(runtime.name)
  options = config.asynchrony
  clock = devices.clock_for(config.devices, client_data, algorithm, config.seed)
  draws = sampling.ClientSampler(client_data.client_ids, options.buffer_size, config.seed)
  schedule = async_schedule.Schedule(
    lambda r: draws.sample(r).sampled,
    (lambda c: 1.0) if clock is None else clock.seconds,
    concurrency=options.concurrency,
    buffer_size=options.buffer_size,
    max_staleness=options.max_staleness,
  )
  return BufferedAsyncRuntime(runtime, schedule, options)
