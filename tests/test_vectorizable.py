"""`ops.vectorizable.conv2d` (per-tap matmuls) equals `tf.nn.conv2d` (and `conv1d`,
`tf.nn.conv1d`), and vectorizes across lanes with each lane's own kernel, gradients
included."""

import numpy as np
import pytest
import tensorflow as tf

from tff_comp.ops import vectorizable


@pytest.mark.parametrize('padding', ['VALID', 'SAME'])
@pytest.mark.parametrize(
  'strides, dilations', [((1, 1), (1, 1)), ((2, 1), (1, 1)), ((1, 1), (2, 1)), ((2, 2), (1, 2))]
)
def test_conv2d_is_tfs(padding, strides, dilations):
  rng = np.random.default_rng(0)
  x = tf.constant(rng.normal(size=(2, 9, 8, 3)), tf.float32)
  kernel = tf.constant(rng.normal(size=(3, 2, 3, 4)), tf.float32)
  want = tf.nn.conv2d(x, kernel, strides, padding, dilations=dilations)
  got = vectorizable.conv2d(x, kernel, strides, padding, dilations)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('padding', ['VALID', 'SAME'])
@pytest.mark.parametrize('stride, dilation', [(1, 1), (2, 1), (1, 2)])
def test_conv1d_is_tfs(padding, stride, dilation):
  rng = np.random.default_rng(2)
  x = tf.constant(rng.normal(size=(2, 11, 3)), tf.float32)
  kernel = tf.constant(rng.normal(size=(3, 3, 4)), tf.float32)
  want = tf.nn.conv1d(x, kernel, stride, padding, dilations=dilation)
  got = vectorizable.conv1d(x, kernel, stride, padding, dilation)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_conv2d_vectorizes_with_each_lanes_kernel_and_its_gradients():
  rng = np.random.default_rng(1)
  x = tf.constant(rng.normal(size=(3, 2, 6, 6, 2)), tf.float32)
  kernels = tf.constant(rng.normal(size=(3, 3, 3, 2, 4)), tf.float32)

  def loss_and_grads(kernel, x, conv):
    with tf.GradientTape() as tape:
      tape.watch([kernel, x])
      loss = tf.reduce_sum(tf.sin(conv(x, kernel, (1, 1), 'SAME')))
    return tape.gradient(loss, [kernel, x])

  want = [
    tf.stack(g) for g in zip(*(loss_and_grads(kernels[i], x[i], tf.nn.conv2d) for i in range(3)))
  ]
  got = tf.function(
    lambda: tf.vectorized_map(
      lambda a: loss_and_grads(a[0], a[1], vectorizable.conv2d),
      (kernels, x),
      fallback_to_while_loop=False,
    )
  )()
  for g, w in zip(got, want):
    np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)
  with pytest.raises(ValueError, match='expected to be loop invariant'):
    tf.function(
      lambda: tf.vectorized_map(
        lambda a: loss_and_grads(a[0], a[1], tf.nn.conv2d),
        (kernels, x),
        fallback_to_while_loop=False,
      )
    )()
