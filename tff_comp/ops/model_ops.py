"""Loss and gradient of a FunctionalModel on a batch (pure TF)."""

from typing import Any

import tensorflow as tf

Weights = tuple[tf.Tensor, ...]


def batch_loss(model, trainable: Weights, non_trainable: Weights, batch: Any) -> tf.Tensor:
  """Loss of `model` (a FunctionalModel) on `batch`."""
  x, y = (batch['x'], batch['y']) if isinstance(batch, dict) else batch
  output = model.predict_on_batch((trainable, non_trainable), x, training=True)
  return model.loss(output=output, label=y)


def batch_loss_and_gradient(
    model, trainable: Weights, non_trainable: Weights, batch: Any
) -> tuple[tf.Tensor, Weights]:
  """Loss of `model` (a FunctionalModel) on `batch` and its gradient."""
  with tf.GradientTape() as tape:
    tape.watch(trainable)
    loss = batch_loss(model, trainable, non_trainable, batch)
  return loss, tuple(tape.gradient(loss, trainable))


def batch_size_of(batch: Any) -> tf.Tensor:
  return tf.shape(tf.nest.flatten(batch)[0])[0]
