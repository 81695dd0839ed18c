"""Lockstep lanes: a cohort's local steps, `lanes` clients at a time, one vectorized step.

Mapping clients one by one pays TensorFlow's per-op cost on every local step of every
client (a fixed cost a step whatever the model's size: docs/speed.md); vectorizing
whole clients (`tf.vectorized_map` of a client's while loop) costs as much again in
masking. Here the cohort's full batches run in `L` lanes:

    lanes take clients longest first (most full batches; a greedy schedule);
    every iteration, each busy lane takes one full batch of its client, all lanes in
    one `tf.vectorized_map` of the rule's `step` (idle lanes are masked out);
    a lane whose client has run its full batches stores the client's state and starts
    the next client (`rule.initialize`); the lanes step without looking for such a lane
    until the first busy one's client runs out (an inner loop that carries the lanes'
    states alone: lasso's step loop 9% faster than looking after every step);
    then the clients' short last batches: for each size the data can give (`sizes`,
    known when the runtime is built), its clients `L` at a time, one vectorized step
    each, in the same XLA program (`run_batches`); past `MAX_KERNEL_SHORT_SIZES` sizes
    (each is one more step for XLA to compile) outside XLA (`run_short_batches`), one
    vectorized step per distinct size in the cohort, in plain TF where shapes may vary.

`run_batches` is built for XLA (`jit_compile=True`): every shape is static and nothing
in the program depends on which clients a round holds, so it compiles once
(`tests/test_lanes.py` counts XLA's compiles). The model's functions are traced inline
there (`ops.model_ops.batch_loss`): a model's `tf.function` traced before for batches
of unknown size served the short batches, and that trace's gradient made XLA take the
kernel's inputs as compile-time constants, compiling once per cohort. The vectorized
step, gradient inside, is one function traced once for a batch of unknown size and
called for the full batches and each short size (XLA compiles each call at its static
shape, still once per kernel): its vectorization was over half of a kernel's trace,
once per size (lasso's first round on lanes 0.4 s sooner: `bench.py`, part 5).
`finish_cohort` gives each client its output (`client_round.finish_client`). Every
client sees exactly the batches of `ops.local_loop.batches`, the same batches the TFF
client work and the mapped runtime take, so the results are the same. Client data are
one resident array of every client's examples (no padding), read through each client's
offset and count.
"""

import heapq
from typing import Any

import numpy as np
import tensorflow as tf

from tff_comp.ops import client_round, local_loop, vectorizable
from tff_comp.ops import rule as rule_lib


def _vectorized_map(fn, elems, **options):
  """`tf.vectorized_map`, its function traced `vectorizable.across_lanes` (so Keras
  convolutions vectorize for each lane's own kernel)."""
  with vectorizable.across_lanes():
    return tf.vectorized_map(fn, elems, **options)


def rows(structure, index):
  """Rows `index` of every tensor of `structure` (tf.gather)."""
  # tf.gather, never t[i] in the XLA kernel: XLA compiles a slice at a tensor index as
  # a constant, so every new index would compile the kernel again.
  return tf.nest.map_structure(lambda t: tf.gather(t, index), structure)


def _put(buffers, row, values):
  """`buffers` with row `row` (a scalar index) replaced by `values`."""
  return tf.nest.map_structure(
    lambda b, v: tf.tensor_scatter_nd_update(b, [[row]], v[None]), buffers, values
  )


def received(payload, hparams, trial: tf.Tensor | None, clients) -> tuple[Any, Any]:
  """(payload, hparams) of `clients` (a scalar or [k] positions): the cohort's, or with
  `trial` (batched trials) the rows of each client's trial of the stacked ones."""
  if trial is None:
    return payload, hparams
  return rows((payload, hparams), tf.gather(trial, clients))


def _step_all(
  rule: rule_lib.ClientRule, payload, hparams, trial, clients, states, batches, contexts, **options
):
  """`rule.step` of every client of `clients` ([k]) at once (vectorized): a shared
  payload stays out of the map, per-trial ones go in by row."""
  if trial is None:
    return _vectorized_map(
      lambda args: rule.step(args[0], args[1], payload, hparams, args[2]),
      (states, batches, contexts),
      **options,
    )
  own = received(payload, hparams, trial, clients)
  return _vectorized_map(
    lambda args: rule.step(args[0], args[1], args[3][0], args[3][1], args[2]),
    (states, batches, contexts, own),
    **options,
  )


def _select(mask, new, old):
  """Per lane (leading axis): `new` where mask, else `old`."""
  return tf.nest.map_structure(
    lambda n, o: tf.where(tf.reshape(mask, [-1] + [1] * (n.shape.rank - 1)), n, o), new, old
  )


def makespan(full: np.ndarray, width: int) -> int:
  """Iterations of `run_batches`' step loop for clients of `full` full batches in
  `width` lanes: the greedy schedule's makespan (longest first, each to the lane free
  first)."""
  free = [0] * width  # a heap of the lanes' busy steps
  for steps in sorted(full.tolist(), reverse=True):
    heapq.heapreplace(free, free[0] + steps)
  return max(free)


def lane_width(full: np.ndarray, capacity: int, lanes: int, *, samples: int = 16) -> int:
  """The lanes a kernel of `capacity` clients runs: of `lanes` to 2 x `lanes` (at
  most `capacity`), the width with the fewest lane-steps (makespan x width, idle
  lanes included: a step costs about its width) over `samples` cohorts of `capacity`
  clients drawn from the population's full-batch counts `full`; ties go to fewer
  lanes. Ten equal clients take one 10-wide pass, not two 8-wide passes the second of
  which steps 6 idle lanes (lasso's kernel is faster so); clients of
  heavy-tailed sizes keep `lanes`, since the largest client sets the makespan."""
  low, high = min(lanes, capacity), min(2 * lanes, capacity)
  if low == high or not len(full):
    return low
  rng = np.random.default_rng(0)  # the choice depends on the data alone
  cohorts = [rng.choice(full, size=capacity, replace=capacity > len(full)) for _ in range(samples)]
  cost = {w: sum(makespan(c, w) for c in cohorts) * w for w in range(low, high + 1)}
  return min(cost, key=lambda w: (cost[w], w))


def shares(full: tf.Tensor, parts: int) -> tf.Tensor:
  """[parts, m / parts] positions of a cohort of `m` clients (`m` a multiple of
  `parts`) whose clients have `full` full batches: balanced shares for kernels run side
  by side, one a thread. The clients in order of their full batches, most first (ties
  in cohort order: batched trials sampling one client stay neighbours), dealt to the
  shares back and forth (0, 1, ..., p - 1, p - 1, ..., 0, 0, 1, ...), so each share's
  lane-steps are about a `parts`-th of the cohort's."""
  order = tf.reshape(tf.argsort(full, direction='DESCENDING', stable=True), [-1, parts])
  back = tf.range(tf.shape(order)[0]) % 2 == 1
  return tf.transpose(tf.where(back[:, None], tf.reverse(order, [1]), order))


# Short-batch sizes `run_batches` takes in its XLA program (each size is one more local
# step for XLA to compile); a population with more runs them in plain TF.
MAX_KERNEL_SHORT_SIZES = 8


def run_batches(
  rule: rule_lib.ClientRule,
  payload,
  hparams,
  options: client_round.ClientOptions,
  examples,
  offsets: tf.Tensor,
  counts: tf.Tensor,
  plans: client_round.ClientPlan,
  *,
  lanes: int,
  sizes: tuple[int, ...] = (),
  trial: tf.Tensor | None = None,
) -> rule_lib.LocalState:
  """Every cohort client's LocalState after its full batches and its short last batch
  when that has one of `sizes` (the others are left to `run_short_batches`), stacked
  in cohort order.

  Args:
    rule, payload, hparams, options: the round's client rule and what it receives.
    examples: every client's examples, concatenated (a structure of [total, ...]).
    offsets, counts: [m] int32, where each cohort client's examples start, how many.
    plans: the cohort's `ClientPlan`s, each field stacked to [m].
    lanes: how many clients step together.
    sizes: the short-batch sizes to run here (every size the population's data give).
    trial: [m] each client's trial (batched trials: payload and hparams per trial).
  """
  size = client_round.step_batch_size(rule, options)
  m = int(offsets.shape[0])
  width = min(lanes, m)
  full = plans.batches.full
  order = tf.argsort(full, direction='DESCENDING', stable=True)

  def context(c):
    return rows(plans.context, c)

  template = rule.initialize(*received(payload, hparams, trial, 0), context(0))
  lane_state = tf.nest.map_structure(lambda t: tf.repeat(t[None], width, axis=0), template)
  states = tf.nest.map_structure(lambda t: tf.zeros([m + 1, *t.shape], t.dtype), template)

  # The rule's step on `width` lanes, traced once for batches of any size and called for
  # the full batches and every short size. No silent per-lane while loop for an op
  # without a vectorization rule: the kernel fails to build instead, and the runtime
  # falls back to mapped clients.
  vectorized_step = tf.function(
    lambda c, st, b, cx: _step_all(
      rule, payload, hparams, trial, c, st, b, cx, fallback_to_while_loop=False
    ),
    autograph=False,
  ).get_concrete_function(
    tf.TensorSpec([width], tf.int32),
    tf.nest.map_structure(tf.TensorSpec.from_tensor, lane_state),
    tf.nest.map_structure(lambda t: tf.TensorSpec([width, None, *t.shape[1:]], t.dtype), examples),
    tf.nest.map_structure(lambda t: tf.TensorSpec([width, *t.shape[1:]], t.dtype), plans.context),
  )

  def needs_service(lane_client, lane_k, taken):
    finished = (lane_client >= 0) & (lane_k >= tf.gather(full, tf.maximum(lane_client, 0)))
    return finished | ((lane_client < 0) & (taken < m))

  def serve(lane_client, lane_k, lane_state, states, taken):
    """Store every lane whose client is done and give it the next client."""

    def body(lane_client, lane_k, lane_state, states, taken):
      lane = tf.argmax(
        tf.cast(needs_service(lane_client, lane_k, taken), tf.int32), output_type=tf.int32
      )
      c = tf.gather(lane_client, lane)
      # Unconditional, so XLA updates the buffer in place; a lane that had no client
      # writes the scratch row m.
      states = _put(states, tf.where(c >= 0, c, m), rows(lane_state, lane))
      following = tf.where(taken < m, tf.gather(order, tf.minimum(taken, m - 1)), -1)
      this_lane = tf.equal(tf.range(width), lane)
      started = rule.initialize(
        *received(payload, hparams, trial, tf.maximum(following, 0)),
        context(tf.maximum(following, 0)),
      )
      lane_state = _select(
        this_lane,
        tf.nest.map_structure(lambda s, v: tf.broadcast_to(v, s.shape), lane_state, started),
        lane_state,
      )
      return (
        tf.where(this_lane, following, lane_client),
        tf.where(this_lane, 0, lane_k),
        lane_state,
        states,
        taken + tf.cast(taken < m, tf.int32),
      )

    return tf.while_loop(
      lambda lane_client, lane_k, _, __, taken: tf.reduce_any(
        needs_service(lane_client, lane_k, taken)
      ),
      body,
      (lane_client, lane_k, lane_state, states, taken),
    )

  def step_lanes(lane_client, lane_k, lane_state, states, taken):
    """The lanes' steps until the first of their clients has run its full batches (no
    lane needs service before), then `serve`."""
    busy = lane_client >= 0
    clients = tf.maximum(lane_client, 0)
    batches, n = local_loop.take(plans.batches, clients), tf.gather(counts, clients)[:, None]
    start, contexts = tf.gather(offsets, clients)[:, None], rows(plans.context, clients)
    steps = tf.reduce_min(tf.where(busy, tf.gather(full, clients) - lane_k, tf.int32.max))

    def step(j, lane_k, lane_state):
      positions = start + local_loop.full_batch(
        batches, lane_k[:, None], size, n, options.shuffle, compiled=True
      )
      stepped = vectorized_step(clients, lane_state, rows(examples, positions), contexts)
      return j + 1, lane_k + tf.cast(busy, tf.int32), _select(busy, stepped, lane_state)

    _, lane_k, lane_state = tf.while_loop(
      lambda j, *_: j < steps, step, (tf.constant(0), lane_k, lane_state)
    )
    return serve(lane_client, lane_k, lane_state, states, taken)

  loop_vars = serve(
    -tf.ones([width], tf.int32), tf.zeros([width], tf.int32), lane_state, states, tf.constant(0)
  )
  _, _, _, states, _ = tf.while_loop(
    lambda lane_client, *_: tf.reduce_any(lane_client >= 0), step_lanes, loop_vars
  )

  # The short batches: clients ordered by their remainder, so each size's clients are
  # one run of that order, stepped `width` at a time (extra lanes write row m).
  by_size = tf.argsort(plans.batches.remainder, stable=True)
  remainders = tf.gather(plans.batches.remainder, by_size)
  for short in sizes:
    end = tf.reduce_sum(tf.cast(remainders <= short, tf.int32))

    def step_short(first, states, short=short, end=end):
      slots = first + tf.range(width)
      clients = tf.gather(by_size, tf.minimum(slots, m - 1))
      positions = tf.gather(offsets, clients)[:, None] + local_loop.short_batch(
        local_loop.take(plans.batches, clients),
        size,
        tf.gather(counts, clients)[:, None],
        options.shuffle,
        size=short,
        compiled=True,
      )
      stepped = vectorized_step(
        clients, rows(states, clients), rows(examples, positions), rows(plans.context, clients)
      )
      written = tf.where(slots < end, clients, m)
      return first + width, tf.nest.map_structure(
        lambda b, v: tf.tensor_scatter_nd_update(b, written[:, None], v), states, stepped
      )

    first = tf.reduce_sum(tf.cast(remainders < short, tf.int32))
    _, states = tf.while_loop(lambda first, _, end=end: first < end, step_short, (first, states))
  return tf.nest.map_structure(lambda t: t[:m], states)


def run_short_batches(
  rule: rule_lib.ClientRule,
  payload,
  hparams,
  options: client_round.ClientOptions,
  examples,
  offsets: tf.Tensor,
  counts: tf.Tensor,
  plans: client_round.ClientPlan,
  states: rule_lib.LocalState,
  *,
  trial: tf.Tensor | None = None,
) -> rule_lib.LocalState:
  """The clients' short last batches from the states of `run_batches` (run without
  `sizes`).

  In plain TF (batch shapes vary), one vectorized step per distinct short-batch size in
  the cohort: at most B - 1 steps a round whatever the cohort's size (client by client
  cost a step's overhead a client). Ops without a vectorization rule loop.
  """
  size = client_round.step_batch_size(rule, options)
  remainder = plans.batches.remainder
  sizes, _ = tf.unique(tf.boolean_mask(remainder, remainder > 0))

  def one_size(k, stepped_states):
    members = tf.cast(tf.where(tf.equal(remainder, sizes[k]))[:, 0], tf.int32)
    positions = tf.gather(offsets, members)[:, None] + local_loop.short_batch(
      local_loop.take(plans.batches, members),
      size,
      tf.gather(counts, members)[:, None],
      options.shuffle,
      size=sizes[k],
    )
    stepped = _step_all(
      rule,
      payload,
      hparams,
      trial,
      members,
      rows(states, members),
      rows(examples, positions),
      rows(plans.context, members),
    )
    return k + 1, tf.nest.map_structure(
      lambda b, v: tf.tensor_scatter_nd_update(b, members[:, None], v), stepped_states, stepped
    )

  # Each size's step reads the incoming `states`, so the sizes' steps run in parallel.
  _, stepped_states = tf.while_loop(
    lambda k, _: k < tf.size(sizes), one_size, (tf.constant(0), states)
  )
  return stepped_states


def finish_cohort(
  rule: rule_lib.ClientRule,
  payload,
  hparams,
  options: client_round.ClientOptions,
  counts: tf.Tensor,
  plans: client_round.ClientPlan,
  states: rule_lib.LocalState,
  *,
  trial: tf.Tensor | None = None,
) -> client_round.ClientOutput:
  """Each client's `ClientOutput` from its state after its batches, stacked in
  cohort order."""
  steps = plans.batches.steps
  # Once per client, so a per-client loop where an op does not vectorize costs little
  # (the per-client tables' rows are a select, which vectorizes: `ops.per_client.slot`).
  if trial is None:
    return _vectorized_map(
      lambda args: client_round.finish_client(
        rule, args[0], args[1], payload, hparams, args[2], options, args[3]
      ),
      (states, steps, plans.context, counts),
    )
  own = received(payload, hparams, trial, tf.range(tf.shape(counts)[0]))

  def finish(args):
    state, client_steps, context, count, (own_payload, own_hparams) = args
    return client_round.finish_client(
      rule, state, client_steps, own_payload, own_hparams, context, options, count
    )

  return _vectorized_map(finish, (states, steps, plans.context, counts, own))
