"""The client's local loop: batches drawn from in-memory examples, steps in-graph.

Why not iterate a `tf.data.Dataset` of batches, as TFF's own client work does?
Inside TFF's C++ worker every dataset element costs a function dispatch; on the lasso
shape (10 clients x 13 batches, d = 1024) a round took 0.037 s with `Dataset.reduce`
and 0.012 s when each client's examples are materialized once and the steps run as
one `tf.while_loop` over slices (measured on the project's 2-core machines). Client
datasets in federated simulations are small, so holding one in memory is cheap.

`plan` is the one source of a client's batch plan (`BatchPlan`): TFF's client work,
the lanes and the mapped engines all take their batches from it. Batches follow
`dataset.repeat(epochs).batch(batch_size)`: batches may straddle epoch boundaries, and
the last batch may be short unless epochs are drawn (then `floor(epochs * n /
batch_size)` steps, FedNova's tau). With `shuffle`, each epoch visits the client's
examples in its own order: a stateless permutation of (run seed, round, client,
epoch) (`shuffle_index`), identical on every runtime; without, in stored order.
"""

from collections.abc import Callable
from typing import Any, NamedTuple

import tensorflow as tf

from tff_comp.ops import stateless

_MAX_EXAMPLES = 2**31 - 1


def materialize(dataset: tf.data.Dataset) -> Any:
  """All elements of a dataset of examples as one structure of stacked tensors.

  An empty dataset gives tensors with a leading dimension of 0.
  """
  empty = tf.data.Dataset.from_tensors(
    tf.nest.map_structure(
      lambda s: tf.zeros([0] + s.shape.as_list(), s.dtype),
      dataset.element_spec,
    )
  )
  batched = dataset.batch(_MAX_EXAMPLES)
  return batched.concatenate(empty).take(1).get_single_element()


def num_examples(examples: Any) -> tf.Tensor:
  """The leading dimension of a structure of stacked examples, as int32."""
  return tf.shape(tf.nest.flatten(examples)[0])[0]


def client_key(examples: Any) -> tf.Tensor:
  """A client's int64 identity from its data: a fingerprint of its first example and
  its size (the same on every runtime, known without the client's index)."""
  first = tf.nest.map_structure(lambda t: t[:1], examples)
  data_bytes = tf.strings.reduce_join([tf.io.serialize_tensor(t) for t in tf.nest.flatten(first)])
  return tf.strings.to_hash_bucket_fast(
    tf.strings.join([data_bytes, tf.strings.as_string(num_examples(examples))]), 2**31 - 1
  )


def draw_epochs(key: tf.Tensor, seed: int, round_num: tf.Tensor, low: int, high: int) -> tf.Tensor:
  """Epochs ~ U{low..high}, a stateless function of (seed, round, the client's `key`
  (`client_key`)): different across clients and rounds, the same across runs.
  Elementwise over a vector of keys."""
  key = tf.convert_to_tensor(key, tf.int64)
  mixed = tf.broadcast_to(
    tf.cast(seed, tf.int64) * 1_000_003 + tf.cast(round_num, tf.int64), tf.shape(key)
  )  # seed and round: one, or one per key
  draws = tf.map_fn(
    lambda mk: tf.random.stateless_uniform(
      [], tf.stack(mk), minval=low, maxval=high + 1, dtype=tf.int32
    ),
    (tf.reshape(mixed, [-1]), tf.reshape(key, [-1])),
    fn_output_signature=tf.int32,
  )
  return tf.reshape(draws, tf.shape(key))


# Swap-or-not rounds: each is an involution of [0, n), so their composition is a
# permutation for any n; 12 rounds mix well enough for ordering training examples.
_SHUFFLE_ROUNDS = 12


def shuffle_index(
  i: tf.Tensor, n: tf.Tensor, seed: tf.Tensor, *, compiled: bool = False
) -> tf.Tensor:
  """Position i of a stateless pseudorandom permutation of [0, n) chosen by `seed`
  (elementwise; the swap-or-not shuffle of Hoang, Morris and Rogaway, 2012).
  `compiled`: traced for XLA, where each round's (pivot - i) mod n is a select (an
  int64 division per example cost the lanes kernel 7%); elsewhere it is one floormod
  (plain TF dispatches each op on its own, so fewer ops cost less). Both give the
  same permutation.

  Why not `tf.random.experimental.index_shuffle`: TF 2.14 has no XLA kernel and no
  vectorization rule for it, and the lanes engine needs both.
  """
  i, seed = tf.cast(i, tf.int64), tf.cast(seed, tf.int64)
  n = tf.cast(tf.maximum(n, 1), tf.int64)

  def swap_or_not(r, i):
    r = tf.cast(r, tf.int64)
    pivot = stateless.mix32(seed * 31 + r * 0x9E3779B1) % n
    if compiled:  # (pivot - i) mod n for pivot and i in [0, n)
      partner = pivot - i
      partner = tf.where(partner < 0, partner + n, partner)
    else:
      partner = (pivot - i) % n
    swap = tf.bitwise.bitwise_and(
      stateless.mix32(stateless.mix32(seed + r * 0x85EBCA6B) + tf.maximum(i, partner)), 1
    )
    return r + 1, tf.where(swap > 0, partner, i)

  # A loop, not unrolled: a twelfth of the graph to trace and compile in every round
  # function that shuffles.
  _, i = tf.while_loop(lambda r, _: r < _SHUFFLE_ROUNDS, swap_or_not, (tf.constant(0, tf.int64), i))
  return i


class BatchPlan(NamedTuple):
  """A client's batches in a round (fields stacked to [m] for a cohort): `full`
  batches of the step's batch size B, then one short batch of `remainder` examples
  when it is not 0. Batch k covers positions [k B, k B + B) of the client's example
  sequence, the short batch [full B, full B + remainder): position p is example
  p mod n of epoch p // n (`positions`), in stored order or, with `seed` (the client's
  shuffle seed of the round), in that epoch's permutation."""

  full: tf.Tensor
  remainder: tf.Tensor
  seed: tf.Tensor  # int64; read only when shuffling

  @property
  def steps(self) -> tf.Tensor:
    """Local steps: the full batches, and the short one if any."""
    return self.full + tf.cast(self.remainder > 0, tf.int32)


def plan(
  counts: tf.Tensor,
  keys: tf.Tensor,
  round_num: tf.Tensor,
  *,
  batch_size: int,
  epochs: int = 1,
  epochs_max: int | None = None,
  steps: int | None = None,
  seed: int = 0,
  shuffle: bool = False,
) -> BatchPlan:
  """The batches of clients with `counts` examples and `keys` (`client_key`) in round
  `round_num`: the one place batches are derived, for every runtime.

  epochs: passes over the examples; with `epochs_max`, drawn per client and round from
    [epochs, epochs_max] (`draw_epochs`), the short batch dropped (floor(E n / B) steps,
    FedNova's tau). steps: if set, exactly this many full batches cycling through the
    examples (none for an empty client). shuffle: each epoch in its own order, a
    stateless function of (seed, round, key, epoch). Elementwise over [m] counts and
    keys.
  """
  n = tf.convert_to_tensor(counts, tf.int32)
  order_seed = tf.zeros_like(n, tf.int64)
  if shuffle:
    order_seed = stateless.mix32(
      stateless.mix32(tf.cast(seed, tf.int64) * 1_000_003 + tf.cast(round_num, tf.int64))
      + tf.cast(keys, tf.int64)
    ) + tf.zeros_like(n, tf.int64)
  if steps is not None:
    return BatchPlan(tf.where(n > 0, steps, 0), tf.zeros_like(n), order_seed)
  if epochs_max is not None:
    total = draw_epochs(keys, seed, round_num, epochs, epochs_max) * n
    return BatchPlan(total // batch_size, tf.zeros_like(n), order_seed)
  total = epochs * n
  return BatchPlan(total // batch_size, total % batch_size, order_seed)


def limit(batches: BatchPlan, work: tf.Tensor) -> BatchPlan:
  """A straggler's batches: the first max(1, floor(work x steps)) of its steps (its
  batch sequence cut short; none stays none); `work` >= 1 keeps every step.
  Elementwise over [m]."""
  steps = batches.steps
  kept = tf.cast(tf.floor(tf.cast(work, tf.float32) * tf.cast(steps, tf.float32)), tf.int32)
  kept = tf.where(work >= 1, steps, tf.clip_by_value(kept, tf.minimum(steps, 1), steps))
  return BatchPlan(
    tf.minimum(batches.full, kept),
    tf.where(kept > batches.full, batches.remainder, 0),
    batches.seed,
  )


def positions(
  first: tf.Tensor, size, n: tf.Tensor, seed: tf.Tensor | None = None, *, compiled: bool = False
) -> tf.Tensor:
  """Examples of the batch of `size` starting at sequence position `first`: position p
  is example p mod n, permuted per epoch p // n when `seed` (a BatchPlan's) is given.
  Broadcasts over leading dimensions of `first`, `n` and `seed` (lanes, cohorts)."""
  n = tf.maximum(n, 1)
  p = first + tf.range(size)
  if seed is None:
    return p % n
  epoch_seed = stateless.mix32(tf.cast(seed, tf.int64) + tf.cast(p // n, tf.int64) * 0x2545F491)
  return tf.cast(shuffle_index(p % n, n, epoch_seed, compiled=compiled), tf.int32)


def full_batch(
  batches: BatchPlan,
  k,
  batch_size: int,
  n: tf.Tensor,
  shuffle: bool = False,
  *,
  compiled: bool = False,
) -> tf.Tensor:
  """Examples of full batch k (k < full) of the clients `batches` plans: positions
  [k B, (k + 1) B) of their example sequences. Elementwise over the plan's shape (one
  client, or lanes: `take`), with a trailing batch axis. Every engine takes its batches
  from this function and `short_batch`."""
  return positions(
    k * batch_size, batch_size, n, batches.seed if shuffle else None, compiled=compiled
  )


def short_batch(
  batches: BatchPlan,
  batch_size: int,
  n: tf.Tensor,
  shuffle: bool = False,
  size=None,
  *,
  compiled: bool = False,
) -> tf.Tensor:
  """Examples of the short last batch: positions [full B, full B + remainder). `size`:
  its length when every client of the call has the same remainder (the lanes engine
  groups clients by it), else the plan's remainder (one client)."""
  return positions(
    batches.full * batch_size,
    batches.remainder if size is None else size,
    n,
    batches.seed if shuffle else None,
    compiled=compiled,
  )


def take(batches: BatchPlan, clients: tf.Tensor) -> BatchPlan:
  """The plans of `clients` (indices into a cohort's plan), each field [len, 1]: the
  shape `full_batch` and `short_batch` broadcast over for a group of clients."""
  return BatchPlan(*(tf.gather(field, clients)[:, None] for field in batches))


def batch_index(
  k, batches: BatchPlan, batch_size: int, n: tf.Tensor, shuffle: bool = False
) -> tf.Tensor:
  """Examples of local step k of one client's `batches` (k < steps): full batch k, or
  the short batch at k = full."""
  return tf.cond(
    k < batches.full,
    lambda: full_batch(batches, k, batch_size, n, shuffle),
    lambda: short_batch(batches, batch_size, n, shuffle),
  )


def run_scheduled_steps(
  step_fn: Callable[[Any, Any], Any],
  initial_state: Any,
  examples: Any,
  batches: BatchPlan,
  *,
  batch_size: int,
  contiguous: bool = False,
  shuffle: bool = False,
) -> Any:
  """`state = step_fn(state, batch)` over the batches `batches` plans (one client).
  `contiguous`: no full batch wraps around the examples (one epoch in stored order),
  so batches are slices. `shuffle`: each epoch in the plan's permutation."""
  n = num_examples(examples)
  if shuffle:
    # Every position of the round at once: one permutation computation per client,
    # not one per local step (op dispatch dominates outside XLA); step k's batch is
    # then a slice of it, at full_batch's positions.
    order = positions(0, batches.full * batch_size + batches.remainder, n, batches.seed)

  def gather(index):
    return tf.nest.map_structure(lambda t: tf.gather(t, index), examples)

  def full(k):
    if shuffle:
      return gather(order[k * batch_size : (k + 1) * batch_size])
    if contiguous:
      return tf.nest.map_structure(lambda t: t[k * batch_size : (k + 1) * batch_size], examples)
    return gather(full_batch(batches, k, batch_size, n))

  def short():
    if shuffle:
      return gather(order[batches.full * batch_size :])
    return gather(short_batch(batches, batch_size, n))

  def body(k, state):
    return k + 1, step_fn(state, full(k))

  _, state = tf.while_loop(lambda k, _: k < batches.full, body, (tf.constant(0), initial_state))
  return tf.cond(batches.remainder > 0, lambda: step_fn(state, short()), lambda: state)
