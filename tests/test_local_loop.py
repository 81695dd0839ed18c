"""The in-graph local loop visits the same batches as dataset.repeat(E).batch(B)."""

import numpy as np
import pytest
import tensorflow as tf

from tff_comp.ops import local_loop


@pytest.mark.parametrize(
  'n,batch_size,epochs,drop',
  [(13, 5, 1, False), (13, 5, 3, False), (13, 5, 3, True), (4, 10, 1, False), (0, 3, 2, False)],
)
def test_batches_match_tf_data(n, batch_size, epochs, drop):
  x = np.arange(n * 2, dtype=np.float32).reshape(n, 2)
  y = np.arange(n, dtype=np.int32)
  dataset = tf.data.Dataset.from_tensor_slices((x, y))
  examples = local_loop.materialize(dataset)
  np.testing.assert_array_equal(examples[0], x)

  max_steps = epochs * n // batch_size + 2

  @tf.function
  def run():
    def step(state, batch):
      """Records the batch's labels (example indices) in row `count`, -1 padded."""
      count, seen = state
      labels = tf.pad(batch[1], [[0, batch_size - tf.shape(batch[1])[0]]], constant_values=-1)
      row = tf.tensor_scatter_nd_update(seen, [[count]], labels[tf.newaxis])
      return count + 1, row

    # Drawn epochs drop the short batch; a one-value draw is `epochs` itself.
    batches = local_loop.plan(
      n, 0, 0, batch_size=batch_size, epochs=epochs, epochs_max=epochs if drop else None
    )
    state = local_loop.run_scheduled_steps(
      step,
      (0, -tf.ones([max_steps, batch_size], tf.int32)),
      examples,
      batches,
      batch_size=batch_size,
    )
    return state, batches.steps

  (count, seen), steps = run()
  expected = list(dataset.repeat(epochs).batch(batch_size, drop_remainder=drop))
  assert int(steps) == int(count) == len(expected)
  for k, (bx, by) in enumerate(expected):  # batch by batch, in order
    got = seen.numpy()[k]
    np.testing.assert_array_equal(got[got >= 0], by.numpy())
    np.testing.assert_array_equal(x[by.numpy()], bx.numpy())
  assert (seen.numpy()[len(expected) :] == -1).all()
  if drop:
    assert int(steps) == (epochs * n) // batch_size


def _sequence(n, batch_size, epochs, round_num, key, seed=0, shuffle=True):
  """The example indices a client visits in a round, in order."""
  batches = local_loop.plan(
    n, key, round_num, batch_size=batch_size, epochs=epochs, seed=seed, shuffle=shuffle
  )
  return np.concatenate(
    [
      local_loop.batch_index(k, batches, batch_size, n, shuffle).numpy()
      for k in range(int(batches.steps))
    ]
  )


def test_shuffled_epochs_are_permutations_that_change_every_round_and_epoch():
  n, batch_size, epochs = 13, 4, 3  # batches straddle epoch boundaries
  seq = _sequence(n, batch_size, epochs, round_num=5, key=77)
  assert len(seq) == n * epochs
  orders = [seq[e * n : (e + 1) * n] for e in range(epochs)]
  for order in orders:  # every example once per epoch
    np.testing.assert_array_equal(np.sort(order), np.arange(n))
  assert not np.array_equal(orders[0], orders[1])  # each epoch its own order
  assert not np.array_equal(orders[0], np.arange(n))  # not stored order
  np.testing.assert_array_equal(seq, _sequence(n, batch_size, epochs, 5, 77))  # repeats
  for other in (
    _sequence(n, batch_size, epochs, 6, 77),  # another round
    _sequence(n, batch_size, epochs, 5, 78),  # another client
    _sequence(n, batch_size, epochs, 5, 77, seed=1),
  ):  # another run seed
    assert not np.array_equal(seq, other)
  np.testing.assert_array_equal(  # without shuffling: stored order
    _sequence(n, batch_size, epochs, 5, 77, shuffle=False), np.arange(n * epochs) % n
  )


def test_shuffle_index_is_a_uniform_permutation():
  for n in (1, 2, 7, 100):
    for seed in range(3):
      got = local_loop.shuffle_index(tf.range(n), n, seed).numpy()
      np.testing.assert_array_equal(np.sort(got), np.arange(n))
  # Where element 0 lands over many seeds: about uniform over 10 places.
  landed = local_loop.shuffle_index(
    tf.zeros(20000, tf.int64), 10, tf.range(20000, dtype=tf.int64)
  ).numpy()
  counts = np.bincount(landed, minlength=10)
  assert counts.min() > 1800 and counts.max() < 2200, counts


def _mix(x: int) -> int:
  x &= 0xFFFFFFFF
  for _ in range(2):
    x ^= x >> 16
    x = (x * 0x45D9F3B) & 0xFFFFFFFF
  return x ^ (x >> 16)


def _swap_or_not(i: int, n: int, seed: int) -> int:
  """The swap-or-not shuffle as local_loop documents it, in Python integers."""
  for r in range(12):
    pivot = _mix(seed * 31 + r * 0x9E3779B1) % n
    partner = (pivot - i) % n
    if _mix(_mix(seed + r * 0x85EBCA6B) + max(i, partner)) & 1:
      i = partner
  return i


def test_shuffle_index_is_the_documented_swap_or_not_shuffle():
  """Every shuffled run's batches (and the stored reproductions' numbers) depend on
  these exact orders: a faster formula must give the same permutation."""
  for n, seed in ((1, 5), (7, 0), (128, 3), (1000, 2**31 + 7)):
    want = [_swap_or_not(i, n, seed) for i in range(n)]
    for compiled in (False, True):  # the plain TF and the XLA kernel's forms
      got = local_loop.shuffle_index(
        tf.range(n), n, tf.constant(seed, tf.int64), compiled=compiled
      ).numpy()
      np.testing.assert_array_equal(got, want, err_msg=f'compiled={compiled}')
