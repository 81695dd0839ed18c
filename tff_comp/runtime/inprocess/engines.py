"""The in-process runtime's engines: how a cohort's client work runs, behind one interface.

As FedJAX's `for_each_client` backends, every engine takes the same cohort and returns
the same thing, each client's `ops.client_round.ClientOutput` stacked in cohort order:

    engine.run(cohort) -> ClientOutput([m] updates, [m] weights, [m] stats)

`cohort` (`engine_interface.Cohort`, beside the interface) holds the payload,
hyperparameters and the cohort's plans (`ops.client_round.ClientPlan`: context and batch
plan, from the one batch plan `ops.local_loop.plan`; for the lanes engine, what it
derives them from in its kernel, `DeferredPlans`), and where each client's examples lie
in the resident data.

* `lanes`: lockstep lanes compiled once by XLA (`runtime.inprocess.lanes`); the fast path for many
  small clients. Needs a vectorizable local step (`ops.rule` says what that means).
* `mapped`: client by client with `tf.map_fn` in the round's graph, no XLA; runs any
  rule TensorFlow runs.
* `debug`: client by client, step by step, eagerly in Python; a failure names the
  client and the stage (initialize, local step k, finalize). Slow; for finding bugs
  (`runtime.inprocess.debug_engine`).
"""

import contextlib

import numpy as np
import tensorflow as tf

from tff_comp.ops import algorithm as algorithm_lib
from tff_comp.ops import client_round, vectorizable
from tff_comp.ops import rule as rule_lib
from tff_comp.runtime.inprocess import engine_interface, resident_data
from tff_comp.runtime.inprocess import lanes as lanes_lib
from tff_comp.runtime.inprocess.debug_engine import DebugEngine


class MappedEngine(engine_interface.ClientByClient):
  """Clients one by one with `tf.map_fn` (`client_round.run_planned` each)."""

  name = 'mapped'
  in_graph = True

  def run(self, cohort: engine_interface.Cohort) -> client_round.ClientOutput:
    algorithm = self._algorithm

    def client(round_fn):
      return lambda position, _, examples: round_fn(
        algorithm.client_rule,
        cohort.received(position)[0],
        examples,
        cohort.received(position)[1],
        engine_interface.row(cohort.plans, position),
        algorithm.client_options,
      )

    return self._data.map_clients(
      client(client_round.run_planned),
      cohort.indices,
      like=client(client_round.planned_output_like),
    )


# Decompositions XLA runs as slow iterative loops on a CPU: with the nuclear-norm prox
# (an SVD per local step) a FedDualAvg round took over ten times as long on lanes as
# mapped.
_SLOW_UNDER_XLA_ON_CPU = frozenset(
  {'Svd', 'Qr', 'SelfAdjointEigV2', 'Eig', 'MatrixSolve', 'MatrixInverse', 'Cholesky'}
)
# Ops `tf.vectorized_map` cannot vectorize when each lane has its own weights: a
# convolution's filter must be loop invariant, and the gradient of a while loop over
# TensorLists (a Keras RNN) fails to convert. Such rules run mapped from the start,
# rather than failing (with TF's pfor error dump) in the first round. (The Conv1D and
# Conv2D layers of `keras_models.from_keras` models vectorize: traced for lanes, they
# run as per-tap matmuls, `ops.vectorizable`.)
_NOT_VECTORIZED = {
  'Conv2D': "a convolution with each client's own filter",
  'Conv3D': "a convolution with each client's own filter",
  'TensorListReserve': 'a recurrent loop (a Keras RNN)',
  'StatelessRandomGetKeyCounter': 'random draws seeded per lane (Dropout)',
}
# Convolutions that vectorize across lanes but are slow there on a CPU, and how slow.
_CONVOLUTIONS_SLOW_ON_CPU_LANES = {
  'Conv2D': 'per-tap matmuls under XLA, which on a CPU took 5-6x the mapped round'
  ' (EMNIST CNN, bench part 6)',
  # pfor vectorizes a per-lane depthwise filter into one grouped convolution.
  'DepthwiseConv2dNative': 'one grouped convolution under XLA, which on a CPU took'
  ' 300x the mapped round (two DepthwiseConv2D layers)',
}


# Local steps a run needs before 'auto' compiles the lanes kernel. Measured on these
# machines (feddualavg on lasso, shuffled, `binaries/bench.py` part 5): compiling the
# lanes kernel costs more than the mapped engine's first round, which lanes then make up
# at about this many local steps (docs/speed.md part 5 measures both).
AUTO_LANES_MIN_STEPS = 25_000


def _step_nodes(
  algorithm: algorithm_lib.Algorithm, examples, payload, hparams, across_lanes: bool = False
) -> set[tuple[str, str]]:
  """(name, op type) of the ops of one local step of the client rule (nested functions
  included), as traced for the lanes engine if `across_lanes`."""
  rule = algorithm.client_rule
  size = client_round.step_batch_size(rule, algorithm.client_options)
  batch = tf.nest.map_structure(lambda v: v[:size], examples)
  context = rule_lib.RoundContext.of(client_index=0)
  with vectorizable.across_lanes() if across_lanes else contextlib.nullcontext():
    graph = (
      tf.function(
        lambda: rule.step(
          rule.initialize(payload, hparams, context), batch, payload, hparams, context
        ),
        autograph=False,
      )
      .get_concrete_function()
      .graph.as_graph_def()
    )
  return {(node.name, node.op) for node in graph.node} | {
    (node.name, node.op) for f in graph.library.function for node in f.node_def
  }


class LanesEngine:
  """Lockstep lanes (`runtime.inprocess.lanes`): every local step and each client's output in one
  XLA kernel compiled once (short last batches of more than
  `lanes.MAX_KERNEL_SHORT_SIZES` sizes vectorized per size outside it, the outputs
  after them; the outputs in the kernel made lasso's round faster: docs/speed.md).
  `short_sizes`: the distinct short-batch sizes of the population's clients.
  `full_batches`: each population client's full batches (round 0's plan); given, a
  kernel may run up to 2 x `lanes` clients together where that takes fewer lane-steps
  (`lanes.lane_width`), when the first cohort it runs fills it (under dropout or
  Poisson sampling most cohorts would leave the extra lanes idle); else `lanes`.
  `threads`: a cohort runs as up to that many kernels side by side (`lanes.shares`),
  each on a thread of TensorFlow's inter-op pool (an XLA kernel runs on one core); a
  client's result does not depend on its share."""

  name = 'lanes'
  in_graph = True
  compiles_per_capacity = True

  def __init__(
    self,
    algorithm: algorithm_lib.Algorithm,
    data: resident_data.ResidentData,
    *,
    lanes: int,
    short_sizes: tuple[int, ...] = (),
    full_batches: np.ndarray | None = None,
    threads: int = 1,
  ):
    self._algorithm, self._data, self.lanes, self.threads = algorithm, data, lanes, threads
    self._full = full_batches
    self._first_cohort: int | None = None  # `note_cohort`
    in_kernel = len(short_sizes) <= lanes_lib.MAX_KERNEL_SHORT_SIZES
    self._kernel_sizes = tuple(short_sizes) if in_kernel else ()
    self._short_outside = not in_kernel
    self._kernel = tf.function(self._local_steps, jit_compile=True, autograph=False)

  @staticmethod
  def why_not(
    algorithm: algorithm_lib.Algorithm,
    examples,
    device: str,
    payload,
    hparams,
    run_steps: int | None = None,
  ) -> str:
    """Why this engine would be slow or fail for `algorithm` on `device`, or '' (a run of
    `run_steps` local steps too short to repay compiling included)."""
    if run_steps is not None and run_steps < AUTO_LANES_MIN_STEPS:
      # Mapped whatever its step holds: said without tracing the step (twice for a
      # convolution; over a second a trace for a Keras RNN).
      return (
        f'a run of about {run_steps} local steps is too short to repay compiling the lanes kernel'
      )
    nodes, on_cpu = _step_nodes(algorithm, examples, payload, hparams), 'CPU' in device.upper()
    ops = {op for _, op in nodes}
    slow = ops & _SLOW_UNDER_XLA_ON_CPU
    if slow and on_cpu:
      return f'its local step runs {", ".join(sorted(slow))}, slow under XLA on a CPU'
    # Traced across lanes, a step differs only in its Keras convolutions (Conv1D's too
    # are Conv2D ops), run there as per-tap matmuls (`ops.vectorizable`).
    lanes_ops = (
      {op for _, op in _step_nodes(algorithm, examples, payload, hparams, across_lanes=True)}
      if 'Conv2D' in ops
      else ops
    )
    unvectorized = sorted(lanes_ops & set(_NOT_VECTORIZED))
    if unvectorized:
      op = unvectorized[0]
      return (
        f'its local step runs {op} ({_NOT_VECTORIZED[op]}), which'
        ' tf.vectorized_map cannot vectorize across lanes'
      )
    convolutions = sorted(ops & set(_CONVOLUTIONS_SLOW_ON_CPU_LANES))
    if on_cpu and convolutions:
      return (
        f'its local step convolves ({convolutions[0]}): on lanes,'
        f' {_CONVOLUTIONS_SLOW_ON_CPU_LANES[convolutions[0]]}'
      )
    return ''

  def note_cohort(self, size: int) -> None:
    """Notes the size of the first cohort, before the kernel is traced for it."""
    if self._first_cohort is None:
      self._first_cohort = size

  def parts(self, capacity: int) -> int:
    """The kernels a cohort of up to `capacity` clients runs as, side by side: each
    takes two clients at least (XLA rounds a one-lane kernel's products differently in
    the last bit, so a client's result would depend on its share)."""
    return max(1, min(self.threads, capacity // 2))

  def width(self, capacity: int) -> int:
    """The lanes of each kernel for `capacity` clients."""
    share = -(-capacity // self.parts(capacity))
    if self._full is None or (self._first_cohort or capacity) < capacity:
      return min(self.lanes, share)
    return lanes_lib.lane_width(self._full, share, self.lanes)

  @property
  def plans_in_kernel(self) -> bool:
    """Whether `run` takes `DeferredPlans` (not where short batches run outside XLA)."""
    return not self._short_outside

  def _local_steps(self, payload, hparams, part, fields, trial, lanes: int, parts: int):
    """(the outputs of share `part` of `parts` of the cohort's padded rows (all of them
    if None; their states where short batches run outside), the share's rows).
    `fields`: the rows' (offsets, counts, plans), or (positions, m, DeferredPlans)."""
    rule, options = self._algorithm.client_rule, self._algorithm.client_options
    offsets, counts, plans = (
      self._planned(*fields) if isinstance(fields[2], engine_interface.DeferredPlans) else fields
    )
    clients = None
    if part is not None:  # a share's rows, taken here: in XLA they cost next to nothing
      clients = tf.gather(lanes_lib.shares(plans.batches.full, parts), part)
      offsets, counts, plans = lanes_lib.rows((offsets, counts, plans), clients)
      trial = None if trial is None else tf.gather(trial, clients)
    states = lanes_lib.run_batches(
      rule,
      payload,
      hparams,
      options,
      self._data.examples,
      offsets,
      counts,
      plans,
      lanes=lanes,
      sizes=self._kernel_sizes,
      trial=trial,
    )
    if self._short_outside:
      return states, clients
    return lanes_lib.finish_cohort(
      rule, payload, hparams, options, counts, plans, states, trial=trial
    ), clients

  def _planned(self, positions: tf.Tensor, m: tf.Tensor, deferred: engine_interface.DeferredPlans):
    """(offsets, counts, plans) of the padded rows `positions` (the first `m` the
    cohort's), the padding's with no examples and no batches, as `run` pads them."""
    valid = tf.range(tf.shape(positions)[0]) < m

    def cohort_only(t):  # the padding's rows zero, as `run` pads the fields it is given
      return tf.where(valid, t, tf.zeros_like(t))

    plans = deferred.plan(positions, deferred.client_indices, deferred.work)
    return (
      cohort_only(tf.gather(self._data.offsets, positions)),
      cohort_only(tf.gather(self._data.counts, positions)),
      tf.nest.map_structure(cohort_only, plans),
    )

  def run(self, cohort: engine_interface.Cohort) -> client_round.ClientOutput:
    rule, options = self._algorithm.client_rule, self._algorithm.client_options
    # The kernel takes `capacity` clients whatever the cohort's size, so XLA compiles it
    # once: the cohort's fields padded with clients of no steps, whose states are cut.
    # Several kernels take a share each of `capacity` rounded up to a multiple of them.
    m, capacity = tf.shape(cohort.indices)[0], cohort.capacity
    parts, width = self.parts(capacity), self.width(capacity)
    size = -(-capacity // parts) * parts
    rows = tf.range(m)[:, None]
    pad = lambda t: tf.scatter_nd(rows, t, [size, *t.shape[1:]])
    if isinstance(cohort.plans, engine_interface.DeferredPlans):  # the plans derived in the kernel
      fields = (
        pad(cohort.indices),
        m,
        cohort.plans._replace(
          client_indices=pad(cohort.plans.client_indices), work=pad(cohort.plans.work)
        ),
      )
    else:
      fields = tf.nest.map_structure(pad, (cohort.offsets, cohort.counts, cohort.plans))
    trial = None if cohort.trial is None else pad(cohort.trial)

    def kernel(part: int | None):
      return self._kernel(cohort.payload, cohort.hparams, part, fields, trial, width, parts)

    if parts == 1:
      done = tf.nest.map_structure(lambda t: t[:m], kernel(None)[0])
    else:  # independent calls, which TensorFlow's executor runs on parallel threads
      outputs, shares = zip(*[kernel(tf.constant(part)) for part in range(parts)])
      # Where each cohort client's output is in the shares' outputs, joined.
      joined = tf.math.invert_permutation(tf.concat(shares, 0))[:m]
      done = tf.nest.map_structure(lambda *t: tf.gather(tf.concat(t, 0), joined), *outputs)
    if not self._short_outside:
      return done
    plans = cohort.plans
    # Deferred only with short batches in XLA.
    assert not isinstance(plans, engine_interface.DeferredPlans)
    states = lanes_lib.run_short_batches(
      rule,
      cohort.payload,
      cohort.hparams,
      options,
      self._data.examples,
      cohort.offsets,
      cohort.counts,
      plans,
      done,
      trial=cohort.trial,
    )
    return lanes_lib.finish_cohort(
      rule,
      cohort.payload,
      cohort.hparams,
      options,
      cohort.counts,
      plans,
      states,
      trial=cohort.trial,
    )


# The engines by name (`--engine`), and the ones 'auto' tries in order: the first whose
# `why_not` is empty (and that can read the data), the next when its first round fails;
# the last runs every rule.
ENGINES: dict[str, type[engine_interface.Engine]] = {
  engine.name: engine for engine in (LanesEngine, MappedEngine, DebugEngine)
}
AUTO_ORDER: tuple[type[engine_interface.Engine], ...] = (LanesEngine, MappedEngine)
