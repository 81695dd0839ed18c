"""The Task record the built-in task builders return: a frozen dataclass implementing
the library's task contract (`tff_comp.task.Task`)."""

from collections.abc import Callable, Mapping, Sequence
import dataclasses
import os
import threading
from typing import Any

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_comp import data as data_lib
from tff_comp.ops import regularizers as regularizers_lib

Metrics = dict[str, float]


@dataclasses.dataclass(frozen=True)
class Task:
  """An experiment's data, model, objective and metrics (`tff_comp.task.Task`).

  Attributes:
    name: the registered name.
    model: the FunctionalModel to train.
    train_data: client datasets of unbatched examples, built where the
      computation runs from a client id (`train_data.dataset_computation`).
    regularizer: psi in the objective F(w) + psi(w) (NoRegularizer if none).
    regularizer_targets: indices of the trainable tensors a user-chosen
      regularizer may cover (usually the kernel).
    evaluate: (trainable weights as numpy, regularizer psi) -> metrics; runs in
      Python, outside TFF (psi is the run's, for the objective value).
    defaults: default run settings (client_learning_rate, server_learning_rate,
      rounds, clients_per_round, batch_size, local_epochs, ...).
    reference: lazily computed reference metrics (e.g. a centralized optimum).
    evaluate_personal: for tasks whose evaluation clients are the training clients,
      ({client id: its personal model's trainable weights} -> metrics), scoring each
      client's own model (algorithms with personal models, such as Ditto).
    evaluate_clients: for tasks with per-client evaluation data, (trainable weights)
      -> one row per client ({'client': id, metric: value, ...}); runs write them to
      `clients/eval_round_<r>.csv` at every evaluation.
    evaluate_personal_clients: as `evaluate_personal`, one row per client
      ({'client': id, 'personal_<metric>': value}), merged into those rows.
    evaluate_many: optionally, [(trainable weights, psi), ...] -> each one's `evaluate`
      metrics, equal to the bit, computed together (a grid's batched trials evaluate
      together, `tff_comp.trials`: the data read once for every model).
    resolved_options: the builder's options it resolved itself ({'model': 'softmax'}
      for emnist's model='auto'), recorded in config.json's `resolved.task_options`
      over the values given.
  """

  name: str
  model: tff.learning.models.FunctionalModel
  train_data: tff.simulation.datasets.ClientData
  regularizer: regularizers_lib.Regularizer
  evaluate: Callable[[tuple[np.ndarray, ...], regularizers_lib.Regularizer], Metrics]
  defaults: Mapping[str, Any]
  regularizer_targets: tuple[int, ...] = (0,)
  reference: Callable[[], Metrics] | None = None
  evaluate_personal: Callable[[Mapping[str, tuple[np.ndarray, ...]]], Metrics] | None = None
  evaluate_clients: Callable[[tuple[np.ndarray, ...]], list[dict[str, Any]]] | None = None
  evaluate_personal_clients: (
    Callable[[Mapping[str, tuple[np.ndarray, ...]]], list[dict[str, Any]]] | None
  ) = None
  evaluate_many: (
    Callable[[Sequence[tuple[tuple[np.ndarray, ...], regularizers_lib.Regularizer]]], list[Metrics]]
    | None
  ) = None
  resolved_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  @property
  def num_clients(self) -> int:
    return len(self.train_data.client_ids)

  def client_arrays(self) -> data_lib.ClientArrays:
    """Every training client's examples as NumPy arrays (`tff_comp.data.ClientArrays`:
    all clients' examples concatenated in client order, each client's count, the ids)."""
    return data_lib.client_arrays(self.train_data)

  @property
  def weight_shapes(self) -> list[tuple[int, ...]]:
    return [tuple(w.shape) for w in self.model.initial_weights[0]]


def with_validation(score: Callable[[Any], Metrics], test: Any, validation: Any) -> Metrics:
  """`score(test)`, and `score(validation)` under names prefixed `validation_`:
  the numbers reported and the numbers a grid may tune on, from the same scorer."""
  metrics = score(test)
  metrics.update({f'validation_{name}': value for name, value in score(validation).items()})
  return metrics


def softmax_scores(
  kernel: np.ndarray, bias: np.ndarray, x: np.ndarray, y: np.ndarray
) -> tuple[float, float]:
  """(mean cross-entropy, accuracy) of softmax regression (kernel, bias) on (x, y), in
  NumPy with the max subtracted from the logits (stable for any scale)."""
  logits = x @ kernel + bias
  logits = logits - logits.max(1, keepdims=True)
  log_probs = logits - np.log(np.exp(logits).sum(1, keepdims=True))
  return (float(-np.mean(log_probs[np.arange(len(y)), y])), float(np.mean(logits.argmax(1) == y)))


def softmax_split_metrics(
  kernel: np.ndarray,
  bias: np.ndarray,
  train: tuple[np.ndarray, np.ndarray],
  test: tuple[np.ndarray, np.ndarray],
  validation: tuple[np.ndarray, np.ndarray],
) -> Metrics:
  """Softmax regression's train_loss, test and validation loss and accuracy (each split
  an (x, y) pair; `softmax_scores`)."""
  train_loss, _ = softmax_scores(kernel, bias, *train)
  test_loss, test_accuracy = softmax_scores(kernel, bias, *test)
  val_loss, val_accuracy = softmax_scores(kernel, bias, *validation)
  return dict(
    train_loss=train_loss,
    test_loss=test_loss,
    test_accuracy=test_accuracy,
    validation_loss=val_loss,
    validation_accuracy=val_accuracy,
  )


class ClassifierScorer:
  """(mean cross-entropy, accuracy) of any FunctionalModel classifier at given
  trainable weights, its non-trainable weights passed as the model holds them.

  It scores in a TF1 graph and session, built once: TFF's Keras conversion
  (`functional_model_from_keras`) runs only in graph context, not in eager or in a
  `tf.function` called eagerly, and this way every FunctionalModel scores alike.
  `masked_labels`: labels left out of the accuracy (a sequence model's pad token, as
  TFF's `MaskedCategoricalAccuracy`); the cross-entropy counts every position.
  `also_masked`: further accuracies by name, each leaving out its labels besides
  `masked_labels` (TFF's word-prediction baseline's `accuracy_no_oov`), computed in
  the same pass (`scores`).
  """

  def __init__(
    self,
    model: tff.learning.models.FunctionalModel,
    masked_labels: tuple[int, ...] = (),
    also_masked: Mapping[str, tuple[int, ...]] | None = None,
  ):
    self._model, self._masked = model, masked_labels
    self._also = dict(also_masked or {})
    self._session = None
    self._building = threading.Lock()  # built once, whichever thread scores first

  def _build(self):
    trainable, non_trainable = self._model.initial_weights
    x_spec, y_spec = self._model.input_spec
    graph = tf.Graph()
    with graph.as_default():
      self._weights = [
        tf.compat.v1.placeholder(tf.as_dtype(w.dtype), np.shape(w)) for w in trainable
      ]
      self._x = tf.compat.v1.placeholder(x_spec.dtype, x_spec.shape)
      self._y = tf.compat.v1.placeholder(y_spec.dtype, y_spec.shape)
      fixed = tuple(tf.constant(w) for w in non_trainable)
      logits = self._model.predict_on_batch((tuple(self._weights), fixed), self._x, training=False)
      labels = tf.cast(self._y, tf.int32)
      self._loss = tf.reduce_mean(
        tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
      )
      hits = tf.equal(tf.argmax(logits, -1, output_type=tf.int32), labels)

      def accuracy(masked):  # (correct, counted) positions, summed over chunks
        counted = tf.ones_like(labels, tf.bool)
        for label in masked:
          counted &= tf.not_equal(labels, label)
        return tf.stack(
          [
            tf.reduce_sum(tf.cast(hits & counted, tf.float32)),
            tf.reduce_sum(tf.cast(counted, tf.float32)),
          ]
        )

      self._accuracy = tf.stack(
        [accuracy(self._masked)] + [accuracy(self._masked + more) for more in self._also.values()]
      )
    self._session = tf.compat.v1.Session(graph=graph)

  # Examples scored per session call: the logits of a large-vocabulary sequence model
  # (StackOverflow: 20 positions x 10,004 words) take 800 KB an example.
  CHUNK = 256

  def __call__(self, trainable, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(mean cross-entropy, accuracy)."""
    scores = self.scores(trainable, x, y)
    return scores['loss'], scores['accuracy']

  def scores(self, trainable, x: np.ndarray, y: np.ndarray) -> dict[str, float]:
    """{'loss', 'accuracy', and each of `also_masked`'s accuracies by its name}."""
    with self._building:
      if self._session is None:
        self._build()
    feed = dict(zip(self._weights, trainable))
    loss, accuracy = 0.0, np.zeros((1 + len(self._also), 2))
    for start in range(0, len(y), self.CHUNK):
      feed[self._x], feed[self._y] = x[start : start + self.CHUNK], y[start : start + self.CHUNK]
      chunk_loss, chunk_accuracy = self._session.run((self._loss, self._accuracy), feed)
      loss += len(feed[self._y]) * float(chunk_loss)
      accuracy += chunk_accuracy
    accuracies = accuracy[:, 0] / np.maximum(accuracy[:, 1], 1.0)
    return dict(
      loss=loss / max(len(y), 1),
      accuracy=float(accuracies[0]),
      **{name: float(a) for name, a in zip(self._also, accuracies[1:])},
    )


# Copies of the model a round holds at once (the server's, the clients' being trained,
# their updates and the optimizers' state): a lower bound, to refuse the hopeless.
_MODEL_COPIES = 4


def check_model_fits(weights: int, sizes: str) -> None:
  """Raises ValueError, before anything is built, when `_MODEL_COPIES` copies of a
  model of `weights` float32 weights exceed this machine's memory (TensorFlow's own
  out-of-memory error comes as a long traceback, after the data is generated).
  `sizes`: the settings that gave the model its size, for the message."""
  memory = os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES')
  need = _MODEL_COPIES * 4 * weights
  if need > memory:
    raise ValueError(
      f'{sizes} make a model of {weights:,} weights: {need / 2**30:,.1f} GB for the'
      f' {_MODEL_COPIES} copies a round holds, more than the {memory / 2**30:.1f} GB of'
      ' this machine.'
    )


def bundled_digits() -> tuple[np.ndarray, np.ndarray]:
  """scikit-learn's bundled 8x8 digits (shipped with the package, no download): x as
  float32 in [0, 1] (1797 x 64), y as int32 labels."""
  from sklearn import datasets

  digits = datasets.load_digits()
  return (digits.data / 16.0).astype(np.float32), digits.target.astype(np.int32)
