"""Functional models (`tff.learning.models.FunctionalModel`) used by the tasks.

Weights are plain tensors, so client rules can differentiate through inner steps.
Examples are (x, y) pairs; `input_spec` describes batches.
"""

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_comp import keras_models


def linear_regression(
  input_shape: tuple[int, ...], *, kernel_shape: tuple[int, ...] | None = None
) -> tff.learning.models.FunctionalModel:
  """y = <W, x> + b with loss 0.5 * mean squared error; weights start at zero.

  Trainable weights: (kernel, bias). The kernel has shape `kernel_shape` (default
  `input_shape`), e.g. a d-vector for lasso or a matrix for nuclear-norm tasks.
  """
  kernel_shape = tuple(kernel_shape or input_shape)
  initial = ((np.zeros(kernel_shape, np.float32), np.zeros([], np.float32)), ())
  axes = len(input_shape)

  @tf.function
  def predict_on_batch(weights, x, training=True):
    del training
    (kernel, bias), _ = weights
    return tf.tensordot(x, kernel, axes=axes) + bias

  @tf.function
  def loss(output, label, sample_weight=None):
    del sample_weight
    return 0.5 * tf.reduce_mean(tf.square(output - label))

  return tff.learning.models.FunctionalModel(
    initial_weights=initial,
    predict_on_batch_fn=predict_on_batch,
    loss_fn=loss,
    input_spec=(
      tf.TensorSpec([None, *input_shape], tf.float32),
      tf.TensorSpec([None], tf.float32),
    ),
  )


@tf.function
def _softmax_cross_entropy(output, label, sample_weight=None):
  """Mean sparse softmax cross-entropy of logits `output` (the classifiers' loss)."""
  del sample_weight
  return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=label, logits=output))


def softmax_regression(num_features: int, num_classes: int) -> tff.learning.models.FunctionalModel:
  """Multinomial logistic regression: logits = x W + b, mean cross-entropy loss."""
  initial = (
    (
      np.zeros([num_features, num_classes], np.float32),
      np.zeros([num_classes], np.float32),
    ),
    (),
  )

  @tf.function
  def predict_on_batch(weights, x, training=True):
    del training
    (kernel, bias), _ = weights
    return tf.matmul(x, kernel) + bias

  return tff.learning.models.FunctionalModel(
    initial_weights=initial,
    predict_on_batch_fn=predict_on_batch,
    loss_fn=_softmax_cross_entropy,
    input_spec=(
      tf.TensorSpec([None, num_features], tf.float32),
      tf.TensorSpec([None], tf.int32),
    ),
  )


def logistic_regression(num_features: int) -> tff.learning.models.FunctionalModel:
  """Binary logistic regression: logit = <w, x> + b, labels in {0, 1} (float32)."""
  initial = ((np.zeros([num_features], np.float32), np.zeros([], np.float32)), ())

  @tf.function
  def predict_on_batch(weights, x, training=True):
    del training
    (kernel, bias), _ = weights
    return tf.linalg.matvec(x, kernel) + bias

  @tf.function
  def loss(output, label, sample_weight=None):
    del sample_weight
    return tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=label, logits=output))

  return tff.learning.models.FunctionalModel(
    initial_weights=initial,
    predict_on_batch_fn=predict_on_batch,
    loss_fn=loss,
    input_spec=(
      tf.TensorSpec([None, num_features], tf.float32),
      tf.TensorSpec([None], tf.float32),
    ),
  )


def mlp_regression(
  layer_sizes: tuple[int, ...] = (1, 40, 40, 1), *, seed: int = 0
) -> tff.learning.models.FunctionalModel:
  """A ReLU MLP for scalar regression (sinewave: 1-40-40-1), 0.5 mean squared error.

  Weights: (W_1, b_1, ..., W_L, b_L), Glorot-uniform kernels from `seed`, zero biases.
  """
  rng = np.random.default_rng(seed)
  weights = []
  for fan_in, fan_out in zip(layer_sizes[:-1], layer_sizes[1:]):
    limit = np.sqrt(6.0 / (fan_in + fan_out))
    weights += [
      rng.uniform(-limit, limit, (fan_in, fan_out)).astype(np.float32),
      np.zeros([fan_out], np.float32),
    ]
  layers = len(layer_sizes) - 1

  @tf.function
  def predict_on_batch(model_weights, x, training=True):
    del training
    trainable, _ = model_weights
    h = x
    for i in range(layers):
      h = tf.matmul(h, trainable[2 * i]) + trainable[2 * i + 1]
      if i < layers - 1:
        h = tf.nn.relu(h)
    return tf.squeeze(h, axis=-1)

  @tf.function
  def loss(output, label, sample_weight=None):
    del sample_weight
    return 0.5 * tf.reduce_mean(tf.square(output - label))

  return tff.learning.models.FunctionalModel(
    initial_weights=(tuple(weights), ()),
    predict_on_batch_fn=predict_on_batch,
    loss_fn=loss,
    input_spec=(
      tf.TensorSpec([None, layer_sizes[0]], tf.float32),
      tf.TensorSpec([None], tf.float32),
    ),
  )


def keras_classifier(keras_model, num_features: int) -> tff.learning.models.FunctionalModel:
  """A Keras classifier (a built model, or a function returning one) of flat float
  features to logits, with int32 labels, as a FunctionalModel with mean sparse softmax
  cross-entropy (`keras_models.from_keras`: every runtime runs it, in-process
  included). Non-trainable weights (an adapted `Normalization` layer's mean and
  variance, a frozen layer's weights) are passed through unchanged."""
  if not isinstance(keras_model, tf.keras.Model):
    keras_model = keras_model()
  return keras_models.from_keras(
    keras_model,
    tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    (tf.TensorSpec([None, num_features], tf.float32), tf.TensorSpec([None], tf.int32)),
  )


def small_cnn(
  image_shape: tuple[int, int, int], num_classes: int, *, filters: int = 16, seed: int = 0
) -> tff.learning.models.FunctionalModel:
  """A small CNN on flat image features, in plain TF (every runtime, XLA included):
  reshape to `image_shape`, 3x3 convolution with `filters` ReLU channels (same
  padding), 2x2 max pooling, a dense layer to `num_classes` logits; mean sparse
  softmax cross-entropy. Glorot-uniform kernels from `seed`, zero biases."""
  height, width, channels = image_shape
  pooled = (height // 2) * (width // 2) * filters
  rng = np.random.default_rng(seed)

  def glorot(shape, fan_in, fan_out):
    limit = np.sqrt(6.0 / (fan_in + fan_out))
    return rng.uniform(-limit, limit, shape).astype(np.float32)

  initial = (
    (
      glorot((3, 3, channels, filters), 9 * channels, 9 * filters),
      np.zeros([filters], np.float32),
      glorot((pooled, num_classes), pooled, num_classes),
      np.zeros([num_classes], np.float32),
    ),
    (),
  )

  @tf.function
  def predict_on_batch(weights, x, training=True):
    del training
    (conv, conv_bias, dense, dense_bias), _ = weights
    images = tf.reshape(x, [-1, height, width, channels])
    hidden = tf.nn.relu(tf.nn.conv2d(images, conv, 1, 'SAME') + conv_bias)
    hidden = tf.nn.max_pool2d(hidden, 2, 2, 'VALID')
    return tf.matmul(tf.reshape(hidden, [-1, pooled]), dense) + dense_bias

  return tff.learning.models.FunctionalModel(
    initial_weights=initial,
    predict_on_batch_fn=predict_on_batch,
    loss_fn=_softmax_cross_entropy,
    input_spec=(
      tf.TensorSpec([None, height * width * channels], tf.float32),
      tf.TensorSpec([None], tf.int32),
    ),
  )


def reshaped_input(
  model: tff.learning.models.FunctionalModel, input_shape: tuple[int, ...]
) -> tff.learning.models.FunctionalModel:
  """`model`, a model of flat features, taking examples of `input_shape` (images),
  flattened before it sees them."""

  @tf.function
  def predict_on_batch(weights, x, training=True):
    return model.predict_on_batch(weights, tf.reshape(x, [tf.shape(x)[0], -1]), training)

  return tff.learning.models.FunctionalModel(
    initial_weights=model.initial_weights,
    predict_on_batch_fn=predict_on_batch,
    loss_fn=model.loss,
    input_spec=(tf.TensorSpec([None, *input_shape], tf.float32), model.input_spec[1]),
  )


def why_not_callable_outside_tff(model: tff.learning.models.FunctionalModel) -> str:
  """Why `model` cannot be called outside TFF's computations ('' when it can): a model
  from `tff.learning.models.functional_model_from_keras` raises when called from eager
  code (outside a TFF computation or a graph). TFF does not export that error's class
  (KerasFunctionalModelError), so it is recognized by name. The check traces once per
  model on purpose, so TensorFlow's warning about frequent retracing (after a few
  builds in one process) is silenced while it runs."""
  x_spec = model.input_spec[0]
  x = tf.zeros([1, *x_spec.shape[1:]], x_spec.dtype)
  logger = tf.get_logger()
  level = logger.level
  logger.setLevel('ERROR')
  try:
    tf.function(lambda: model.predict_on_batch(model.initial_weights, x), autograph=False)()
  except Exception as error:
    if type(error).__name__ == 'KerasFunctionalModelError':
      return (
        'a Keras model converted by TFF runs inside TFF computations only; run it on'
        ' the TFF runtime.'
      )
    raise
  finally:
    logger.setLevel(level)
  return ''
