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

  @tf.function
  def run():
    def step(state, batch):
      count, total, labels = state
      return count + 1, total + tf.reduce_sum(batch[0]), labels + tf.reduce_sum(batch[1])
    return local_loop.run_local_steps(
        step, (0, 0.0, 0), examples, batch_size=batch_size, epochs=epochs,
        drop_remainder=drop)

  (count, total, labels), steps = run()
  expected = list(dataset.repeat(epochs).batch(batch_size, drop_remainder=drop))
  assert int(steps) == int(count) == len(expected)
  assert float(total) == pytest.approx(sum(float(tf.reduce_sum(b[0])) for b in expected))
  assert int(labels) == sum(int(tf.reduce_sum(b[1])) for b in expected)
  if drop:
    assert int(steps) == (epochs * n) // batch_size
