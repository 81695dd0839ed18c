"""Federated EMNIST (Caldas et al. 2018, LEAF; TFF's `emnist` dataset): handwritten
characters, one client per writer.

* source 'tff': TFF's published file `emnist_all.sqlite`, read offline from
  `data_dir` (default ~/.tff, where TFF's loader caches it; `tff_files`): 3,400 writers
  and 62 classes (digits, upper and lower case), or with `only_digits` 3,383 writers
  and 10 classes. Preprocessing as TFF's character-recognition baseline
  (`tff.simulation.baselines.emnist.emnist_preprocessing`): pixels (28, 28) in [0, 1]
  as (28, 28, 1), the label as int32.
* source 'synthetic': data of the same shapes and population without the file, that a
  model can learn: each class has a template image drawn from the seed, and an example
  is 0.12 of its class's template and 0.88 uniform noise, its label uniform; client sizes
  lognormal around TFF's mean of about 198 (62 classes; 101 for digits) examples a
  writer, drawn from the seed. For benchmarks and the simulated-time comparison
  (`fedbuff_emnist`); its outputs are labelled synthetic (config.json's task_options,
  the task's name `emnist[synthetic]`).

Model 'cnn_dropout': the CNN of TFF's baseline (`emnist_models.create_conv_dropout_model`,
Reddi et al. 2021): Conv 32 3x3, Conv 64 3x3, max pooling, Dropout 0.25, Dense 128,
Dropout 0.5, Dense to the classes, ReLU, as a Keras model (`keras_models.from_keras`;
its Dropout masks are drawn statelessly from each step's weights and batch, so every
runtime draws the same, and it runs mapped). 'cnn': the same without its Dropout layers
(the default on TFF's file). 'softmax': multinomial logistic regression on the flat
pixels (the default on the synthetic source, where the CNN with its defaults stayed at
chance for 30 rounds: its templates are faint, 0.12 of each image, pixel by pixel).
The default client learning rate is 0.02 for the CNNs (TFF's baseline), 0.1 for
softmax regression.
Evaluation (without dropout): cross-entropy and accuracy on the test writers' examples
and on training examples (`tasks.classification`).
"""

import dataclasses
from typing import Literal

import tensorflow as tf

from tff_comp import keras_models, models, registry
from tff_comp.tasks import base, classification, generated, tff_files

# Writers, examples in train and test (TFF's emnist.load_data documentation).
POPULATION = {False: (3400, 671_585, 77_483), True: (3383, 341_873, 40_832)}
# The task's own models (--model); a registered model plugin may take another name.
MODELS = ('softmax', 'cnn', 'cnn_dropout')


def cnn(num_classes: int, seed: int = 0, dropout: bool = False) -> tf.keras.Model:
  """The baseline CNN, with its Dropout layers if `dropout` (see the module docstring)."""
  tf.keras.utils.set_random_seed(seed)
  layers = tf.keras.layers
  return tf.keras.Sequential(
    [
      layers.InputLayer((28, 28, 1)),
      layers.Conv2D(32, 3, activation='relu'),
      layers.Conv2D(64, 3, activation='relu'),
      layers.MaxPool2D(),
      *([layers.Dropout(0.25)] if dropout else []),
      layers.Flatten(),
      layers.Dense(128, activation='relu'),
      *([layers.Dropout(0.5)] if dropout else []),
      layers.Dense(num_classes),
    ]
  )


def _to_examples(dataset: tf.data.Dataset) -> tf.data.Dataset:
  return dataset.map(lambda e: (tf.expand_dims(e['pixels'], -1), tf.cast(e['label'], tf.int32)))


_TEMPLATES = 0x7E3A  # the synthetic class templates' stream, apart from the examples'
_SIGNAL = 0.12  # the template's share of a synthetic image


def _synthetic(only_digits: bool, clients: int, seed: int):
  """(train, test) ClientData of EMNIST's shapes; each client generated on demand."""
  writers, train_examples, test_examples = POPULATION[only_digits]
  classes = 10 if only_digits else 62

  def make(n, key):
    labels = tf.random.stateless_uniform([n], key + 1, 0, classes, tf.int32)
    templates = tf.random.stateless_uniform([classes, 28, 28, 1], [seed, _TEMPLATES])
    return (
      _SIGNAL * tf.gather(templates, labels)
      + (1 - _SIGNAL) * tf.random.stateless_uniform([n, 28, 28, 1], key),
      labels,
    )

  return tuple(
    generated.client_data(
      prefix, generated.lognormal_sizes(clients, total / writers, seed + salt), seed, make
    )
    for prefix, total, salt in (('train', train_examples, 0), ('test', test_examples, 1))
  )


@registry.register_task('emnist')
def build_emnist_task(
  *,
  source: Literal['tff', 'synthetic'] = 'tff',
  data_dir: str = '',
  only_digits: bool = False,
  model: str = 'auto',
  max_clients: int = 0,
  seed: int = 0,
) -> base.Task:
  """Federated EMNIST (see the module docstring).

  Args:
    source: 'tff' (TFF's emnist_all.sqlite, offline) or 'synthetic' (same shapes).
    data_dir: the folder holding emnist_all.sqlite (default ~/.tff).
    only_digits: the 10-class digits subset, else all 62 classes.
    model: 'cnn' (the baseline CNN without dropout, Keras), 'cnn_dropout' (with its
      Dropout layers), 'softmax', a model plugin's name (`registry.register_model`), or
      'auto': 'cnn' on TFF's file, 'softmax' on the synthetic source.
    max_clients: train on the first this many writers only (0: all of them); synthetic
      data generate this many (0: the real population's size).
    seed: the synthetic data and the model's initial weights.
  """
  if max_clients < 0:
    raise ValueError(f'max_clients must be >= 0, got {max_clients}.')
  classes = 10 if only_digits else 62
  if model == 'auto':
    model = 'softmax' if source == 'synthetic' else 'cnn'
  keras_models.check_model_name(model, MODELS)  # before the data is built
  if source == 'tff':
    train, test = tff_files.load('emnist', data_dir, only_digits=only_digits)
    train, test = train.preprocess(_to_examples), test.preprocess(_to_examples)
    train = tff_files.first_clients(train, max_clients)
  elif source == 'synthetic':
    train, test = _synthetic(only_digits, max_clients or POPULATION[only_digits][0], seed)
  else:
    raise ValueError(f"source={source!r} is unknown; choose 'tff' or 'synthetic'.")
  if model == 'softmax':
    network = models.reshaped_input(models.softmax_regression(784, classes), (28, 28, 1))
  elif model in ('cnn', 'cnn_dropout'):
    network = keras_models.from_keras(
      cnn(classes, seed, dropout=model == 'cnn_dropout'),
      tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
      (tf.TensorSpec([None, 28, 28, 1], tf.float32), tf.TensorSpec([None], tf.int32)),
    )
  else:
    network = keras_models.registered_classifier(model, (28, 28, 1), classes, seed, built_in=MODELS)
  name = 'emnist' if source == 'tff' else 'emnist[synthetic]'
  task = classification.classification_task(
    name,
    train,
    test,
    network,
    seed=seed,
    defaults=dict(
      clients_per_round=10,
      batch_size=20,
      client_learning_rate=0.1 if model == 'softmax' else 0.02,
      rounds=1500,
      eval_period=100,
    ),
  )
  return dataclasses.replace(task, resolved_options={'model': model})
