"""The in-graph local loop visits the same batches as dataset.repeat(E).batch(B)."""

import numpy as np
import pytest
import tensorflow as tf

from tff_comp.ops import local_loop


@pytest.mark.parametrize('n,batch_size,epochs,drop', [
    (13, 5, 1, False), (13, 5, 3, False), (13, 5, 3, True), (4, 10, 1, False),
    (0, 3, 2, False)])
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
      labels = tf.pad(batch[1], [[0, batch_size - tf.shape(batch[1])[0]]],
                      constant_values=-1)
      row = tf.tensor_scatter_nd_update(seen, [[count]], labels[tf.newaxis])
      return count + 1, row
    # Drawn epochs drop the short batch; a one-value draw is `epochs` itself.
    schedule = local_loop.plan(n, 0, 0, batch_size=batch_size, epochs=epochs,
                               epochs_max=epochs if drop else None)
    state = local_loop.run_scheduled_steps(
        step, (0, -tf.ones([max_steps, batch_size], tf.int32)), examples, schedule,
        batch_size=batch_size)
    return state, schedule.steps

  (count, seen), steps = run()
  expected = list(dataset.repeat(epochs).batch(batch_size, drop_remainder=drop))
  assert int(steps) == int(count) == len(expected)
  for k, (bx, by) in enumerate(expected):  # batch by batch, in order
    got = seen.numpy()[k]
    np.testing.assert_array_equal(got[got >= 0], by.numpy())
    np.testing.assert_array_equal(x[by.numpy()], bx.numpy())
  assert (seen.numpy()[len(expected):] == -1).all()
  if drop:
    assert int(steps) == (epochs * n) // batch_size
