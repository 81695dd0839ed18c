"""Lockstep lanes: a cohort's local steps, `lanes` clients at a time, one vectorized step.

Mapping clients one by one pays TensorFlow's per-op cost on every local step of every
client (about 21 us a step measured on the project's 2-core machines, whatever the
model's size); vectorizing whole clients (`tf.vectorized_map` of a client's while loop)
costs as much again in masking. Here the cohort runs in `L` lanes:

    lanes take clients longest first (most full batches; a greedy schedule);
    every iteration, each busy lane takes one full batch of its client, all lanes in
    one `tf.vectorized_map` of the rule's `step` (idle lanes are masked out);
    a lane whose client has run its full batches takes the client's short last batch
    (if any) on its own, finishes the client (`protocol.finish_client`) into the
    cohort's stacked outputs, and starts the next client (`rule.initialize`).

Every client sees exactly the batches of `ops.local_loop.schedule`, the same batches
the TFF client work and the mapped runtime take, so the results are the same. Built for
XLA (`jit_compile=True`): every shape is static. The short batch has one of a few sizes
known from the data (`remainders`), so it runs as a `tf.switch_case` over them. Client
data are one resident array of every client's examples (no padding), read through each
client's offset and count.
"""

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from tff_comp.ops import local_loop
from tff_comp.ops import protocol
from tff_comp.ops import rule as rule_lib


def _rows(structure, index):
  # tf.gather, never t[i]: XLA compiles a slice at a tensor index as a constant,
  # so every new index would compile the kernel again.
  return tf.nest.map_structure(lambda t: tf.gather(t, index), structure)


def _put(buffers, row, values):
  """`buffers` with row `row` (a scalar index) replaced by `values`."""
  return tf.nest.map_structure(
      lambda b, v: tf.tensor_scatter_nd_update(b, [[row]], v[None]), buffers, values)


def _select(mask, new, old):
  """Per lane (leading axis): `new` where mask, else `old`."""
  return tf.nest.map_structure(
      lambda n, o: tf.where(tf.reshape(mask, [-1] + [1] * (n.shape.rank - 1)), n, o),
      new, old)


def run_cohort(rule: rule_lib.ClientRule, payload, hparams, options: protocol.ClientOptions,
               examples, offsets: tf.Tensor, counts: tf.Tensor, plans: protocol.ClientPlan,
               *, lanes: int, remainders: Sequence[int]) -> protocol.ClientOutput:
  """Every cohort client's `ClientOutput`, stacked in cohort order (see module doc).

  Args:
    rule, payload, hparams, options: the round's client rule and what it receives.
    examples: every client's examples, concatenated (a structure of [total, ...]).
    offsets, counts: [m] int32, where each cohort client's examples start, how many.
    plans: the cohort's `ClientPlan`s, each field stacked to [m].
    lanes: how many clients step together.
    remainders: every nonzero size the short last batch can have (static).
  """
  size = protocol.step_batch_size(rule, options)
  m = int(offsets.shape[0])
  width = min(lanes, m)
  full, remainder = plans.full, plans.remainder
  remainders = sorted(set(int(r) for r in remainders) - {0})
  order = tf.argsort(full, direction='DESCENDING', stable=True)

  def context(c):
    return _rows(plans.context, c)

  def batch(c, first, batch_size):
    positions = tf.gather(offsets, c) + local_loop.batch_positions(
        first, batch_size, tf.gather(counts, c))
    return _rows(examples, positions)

  def finish(state, c):
    """The client's short batch (if any), then its output."""
    if remainders:
      which = tf.reduce_sum(tf.range(1, len(remainders) + 1) * tf.cast(
          tf.equal(tf.constant(remainders), tf.gather(remainder, c)), tf.int32))
      branches = [lambda: state] + [
          (lambda r=r: rule.step(state, batch(c, tf.gather(full, c) * size, r), payload, hparams,
                                 context(c))) for r in remainders]
      state = tf.switch_case(which, branches)
    steps = tf.gather(full, c) + tf.cast(tf.gather(remainder, c) > 0, tf.int32)
    return protocol.finish_client(rule, state, steps, payload, hparams, context(c),
                                  options, tf.gather(counts, c))

  template = rule.initialize(payload, hparams, context(0))
  lane_state = tf.nest.map_structure(
      lambda t: tf.repeat(t[None], width, axis=0), template)
  outputs = tf.nest.map_structure(
      lambda t: tf.zeros([m + 1, *t.shape], t.dtype), finish(template, 0))

  def needs_service(lane_client, lane_k, taken):
    finished = (lane_client >= 0) & (lane_k >= tf.gather(full, tf.maximum(lane_client, 0)))
    return finished | ((lane_client < 0) & (taken < m))

  def serve(lane_client, lane_k, lane_state, outputs, taken):
    """Finish every lane whose client is done and give it the next client."""

    def body(lane_client, lane_k, lane_state, outputs, taken):
      lane = tf.argmax(tf.cast(needs_service(lane_client, lane_k, taken), tf.int32),
                       output_type=tf.int32)
      c = tf.gather(lane_client, lane)
      # Unconditional, so XLA updates the buffer in place; a lane that had no client
      # writes the scratch row m.
      outputs = _put(outputs, tf.where(c >= 0, c, m),
                     finish(_rows(lane_state, lane), tf.maximum(c, 0)))
      following = tf.where(taken < m, tf.gather(order, tf.minimum(taken, m - 1)), -1)
      this_lane = tf.equal(tf.range(width), lane)
      started = rule.initialize(payload, hparams, context(tf.maximum(following, 0)))
      lane_state = _select(this_lane, tf.nest.map_structure(
          lambda s, v: tf.broadcast_to(v, s.shape), lane_state, started), lane_state)
      return (tf.where(this_lane, following, lane_client),
              tf.where(this_lane, 0, lane_k), lane_state, outputs,
              taken + tf.cast(taken < m, tf.int32))

    return tf.while_loop(
        lambda lane_client, lane_k, _, __, taken: tf.reduce_any(
            needs_service(lane_client, lane_k, taken)),
        body, (lane_client, lane_k, lane_state, outputs, taken))

  def step_lanes(lane_client, lane_k, lane_state, outputs, taken):
    busy = lane_client >= 0
    clients = tf.maximum(lane_client, 0)
    positions = (tf.gather(offsets, clients)[:, None]
                 + (lane_k[:, None] * size + tf.range(size)[None])
                 % tf.maximum(tf.gather(counts, clients), 1)[:, None])
    stepped = tf.vectorized_map(
        lambda args: rule.step(args[0], args[1], payload, hparams, args[2]),
        (lane_state, _rows(examples, positions), _rows(plans.context, clients)))
    lane_state = _select(busy, stepped, lane_state)
    return serve(lane_client, lane_k + tf.cast(busy, tf.int32), lane_state, outputs, taken)

  loop_vars = serve(-tf.ones([width], tf.int32), tf.zeros([width], tf.int32), lane_state,
                    outputs, tf.constant(0))
  _, _, _, outputs, _ = tf.while_loop(
      lambda lane_client, *_: tf.reduce_any(lane_client >= 0), step_lanes, loop_vars)
  return tf.nest.map_structure(lambda t: t[:m], outputs)
