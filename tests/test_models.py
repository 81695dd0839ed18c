"""Models beyond the linear ones: the small CNN gives the TFF process's results on the
in-process lanes engine; a Keras model (with non-trainable weights) trains on TFF's runtime,
keeps its non-trainable weights, and its task evaluates it."""

import math

import numpy as np
import pytest
import tensorflow as tf

from tff_comp import models
from tff_comp.algorithms import fedavg
from tff_comp.runtime import choice
from tff_comp.tasks import base, imbalanced_digits


def _rounds(process, client_data, ids, rounds, runtime):
  runner, chosen = choice.runner_for(process, client_data, runtime)
  state = runner.initialize()
  for _ in range(rounds):
    state = runner.next(state, ids).state
  return process.get_model_weights(state) if runtime == 'tff' else runner.get_model_weights(
    state
  ), chosen


def test_small_cnn_in_process_equals_the_tff_process():
  """It runs mapped, saying why from the start (tf.vectorized_map cannot vectorize a
  convolution with a per-lane filter; before 0.3.0 the run announced lanes and fell back
  after a failed first round)."""
  task = imbalanced_digits.build_imbalanced_digits_task(model='cnn')
  process = fedavg.build_fedavg(task.model, client_learning_rate=0.1, batch_size=8)
  ids = list(task.train_data.client_ids[1:5])  # the small clients: a short test
  fast, chosen = _rounds(process, task.train_data, ids, 2, 'inprocess')
  assert 'mapped engine (its local step runs Conv2D' in chosen
  slow, _ = _rounds(process, task.train_data, ids, 2, 'tff')
  moved = np.abs(fast.trainable[2] - task.model.initial_weights[0][2]).max()
  assert moved > 1e-3
  for a, b in zip(fast.trainable, slow.trainable):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_a_keras_model_with_non_trainable_weights_trains_in_process_and_evaluates():
  digits = imbalanced_digits.build_imbalanced_digits_task()
  pixels = digits.client_arrays().examples[0]
  normalize = tf.keras.layers.Normalization()  # non-trainable mean, variance, count
  normalize.adapt(pixels)
  keras_model = tf.keras.Sequential(
    [
      tf.keras.layers.InputLayer(input_shape=(64,)),
      normalize,
      tf.keras.layers.Dense(10, kernel_initializer='zeros'),
    ]
  )
  task = imbalanced_digits.build_imbalanced_digits_task(keras_model=keras_model)
  assert [np.shape(w) for w in task.model.initial_weights[1]] == [(64,), (64,), ()]
  process = fedavg.build_fedavg(task.model, client_learning_rate=0.1, batch_size=10)
  before = task.evaluate(tuple(task.model.initial_weights[0]))
  weights, chosen = _rounds(process, task.train_data, list(task.train_data.client_ids), 5, 'auto')
  assert chosen.startswith('inprocess')
  for kept, initial in zip(weights.non_trainable, task.model.initial_weights[1]):
    np.testing.assert_array_equal(kept, initial)
  after = task.evaluate(tuple(weights.trainable))
  assert all(math.isfinite(v) for v in after.values())
  assert before['mean_loss'] == pytest.approx(math.log(10), rel=1e-5)  # zero weights
  assert after['mean_loss'] < 0.8 * before['mean_loss']
  # Evaluation scores through the normalization: the same weights without it differ.
  plain = base.ClassifierScorer(
    models.keras_classifier(
      tf.keras.Sequential(
        [tf.keras.layers.InputLayer(input_shape=(64,)), tf.keras.layers.Dense(10)]
      ),
      64,
    )
  )
  x, y = digits.client_arrays().examples
  assert plain(tuple(weights.trainable), x, y) != base.ClassifierScorer(task.model)(
    tuple(weights.trainable), x, y
  )
