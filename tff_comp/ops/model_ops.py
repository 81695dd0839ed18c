"""Loss and gradient of a FunctionalModel on a batch (pure TF)."""

from typing import Any

import tensorflow as tf

from tff_comp.ops import vectorizable

# The trainable (or non-trainable) tensors of a model: the one alias every module uses.
Weights = tuple[tf.Tensor, ...]


def batch_loss(model, trainable: Weights, non_trainable: Weights, batch: Any) -> tf.Tensor:
  """Loss of `model` (a FunctionalModel) on `batch`."""
  x, y = (batch['x'], batch['y']) if isinstance(batch, dict) else batch
  if vectorizable.tracing_across_lanes():
    # The model's functions inline, at the batch's static shape: a FunctionalModel's
    # tf.function traced before for batches of unknown size (a whole client's data)
    # serves every batch, and that trace's gradient made XLA take the lanes kernel's
    # inputs as compile-time constants (a compile per cohort; XLA's const_analysis log).
    # TFF's FunctionalModel keeps them as `_predict_on_batch_fn` and `_loss_fn`.
    output = _inline(model._predict_on_batch_fn)((trainable, non_trainable), x, True)
    return _inline(model._loss_fn)(output, y)
  output = model.predict_on_batch((trainable, non_trainable), x, training=True)
  return model.loss(output=output, label=y)


def _inline(fn):
  """The Python function of a `tf.function` (`fn` itself otherwise)."""
  return getattr(fn, 'python_function', fn)


def batch_loss_and_gradient(
  model, trainable: Weights, non_trainable: Weights, batch: Any
) -> tuple[tf.Tensor, Weights]:
  """Loss of `model` (a FunctionalModel) on `batch` and its gradient."""
  with tf.GradientTape() as tape:
    tape.watch(trainable)
    loss = batch_loss(model, trainable, non_trainable, batch)
  return loss, tuple(tape.gradient(loss, trainable))


def trainable_specs(model) -> tuple[tf.TensorSpec, ...]:
  """TensorSpecs of a FunctionalModel's trainable weights (what server rules take)."""
  return tuple(tf.TensorSpec(w.shape, w.dtype) for w in model.initial_weights[0])


def batch_size_of(batch: Any) -> tf.Tensor:
  return tf.shape(tf.nest.flatten(batch)[0])[0]


def hessian_vector_product(
  model, trainable: Weights, non_trainable: Weights, batch: Any, vector: Weights
) -> Weights:
  """H(w; batch) v by forward-over-reverse automatic differentiation (never forms H)."""
  with tf.autodiff.ForwardAccumulator(trainable, vector) as accumulator:
    _, gradient = batch_loss_and_gradient(model, trainable, non_trainable, batch)
  return tuple(accumulator.jvp(gradient))


def finite_difference_hvp(
  model, trainable: Weights, non_trainable: Weights, batch: Any, vector: Weights, delta
) -> Weights:
  """(grad f(w + delta v) - grad f(w - delta v)) / (2 delta): Per-FedAvg's HF estimate."""
  plus = tuple(w + delta * v for w, v in zip(trainable, vector))
  minus = tuple(w - delta * v for w, v in zip(trainable, vector))
  _, g_plus = batch_loss_and_gradient(model, plus, non_trainable, batch)
  _, g_minus = batch_loss_and_gradient(model, minus, non_trainable, batch)
  return tuple((a - b) / (2 * delta) for a, b in zip(g_plus, g_minus))


def adapt(
  model, trainable: Weights, non_trainable: Weights, batch: Any, step_size
) -> tuple[tf.Tensor, Weights]:
  """One MAML adaptation step: (loss at w on `batch`, w - step_size grad f(w; batch))."""
  loss, grads = batch_loss_and_gradient(model, trainable, non_trainable, batch)
  return loss, tuple(w - step_size * g for w, g in zip(trainable, grads))
