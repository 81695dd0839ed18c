"""Federated CIFAR-100 (Reddi et al. 2021; TFF's `cifar100` dataset): 500 training and
100 test clients of 100 images, partitioned by a Pachinko allocation over the coarse
and fine labels.

* source 'tff': TFF's published file `cifar100.sqlite`, read offline from `data_dir`
  (default ~/.tff; `tff_files`). Preprocessing as TFF's image-classification baseline
  (`tff.simulation.baselines.cifar100.image_classification_preprocessing.build_image_map`,
  used here): float pixels, a centre crop to `crop` x `crop` (24 in the baseline), then
  `tf.image.per_image_standardization`; the label is the fine label (100 classes). The
  baseline's optional random crops and flips are not applied: the runtimes keep a
  client's examples resident, so a distortion would be drawn once, not per epoch.
* source 'synthetic': images of the same shapes, each its class's template (a fixed
  Gaussian image per class) in Gaussian noise, standardized (the template 0.3 of the
  standard deviation), so the labels can be learned; 500 + 100 clients of 100 examples
  (the real sizes); outputs are labelled synthetic (task name `cifar100[synthetic]`).

Model 'resnet18': TFF's baseline ResNet-18 with group normalization
(`tff.simulation.models.resnet_models.create_resnet18`, a Keras model, converted by
`keras_models.from_keras`); 'cnn': `models.small_cnn` (a 3x3 convolution, pooling, a
dense layer) for quick runs, the synthetic source's default (ResNet-18 takes about a
minute a round on 2 cores). Evaluation: cross-entropy and accuracy on the test
clients' images and on training images (`tasks.classification`).
"""

import dataclasses
from typing import Literal

import tensorflow as tf
from tensorflow_federated.python.simulation.baselines.cifar100 import (
  image_classification_preprocessing as tff_preprocessing,
)
from tensorflow_federated.python.simulation.models import resnet_models

from tff_comp import keras_models, models, registry
from tff_comp.tasks import base, classification, generated, tff_files

CLASSES, TRAIN_CLIENTS, TEST_CLIENTS, CLIENT_SIZE = 100, 500, 100, 100
_TEMPLATES = 0x0C1F  # the synthetic class templates' stream, apart from the examples'
_SIGNAL = 0.3  # the template's share of a synthetic image's standard deviation
# The task's own models (--model); a registered model plugin may take another name.
MODELS = ('cnn', 'resnet18')


@registry.register_task('cifar100')
def build_cifar100_task(
  *,
  source: Literal['tff', 'synthetic'] = 'tff',
  data_dir: str = '',
  model: str = 'auto',
  crop: int = 24,
  max_clients: int = 0,
  seed: int = 0,
) -> base.Task:
  """Federated CIFAR-100 (see the module docstring).

  Args:
    source: 'tff' (TFF's cifar100.sqlite, offline) or 'synthetic' (same shapes).
    data_dir: the folder holding cifar100.sqlite (default ~/.tff).
    model: 'resnet18' (TFF's, group norm), 'cnn' (`models.small_cnn`), a model
      plugin's name (`registry.register_model`), or 'auto': 'resnet18' on TFF's file,
      'cnn' on the synthetic source.
    crop: the side of the centre crop (1 to 32).
    max_clients: train on the first this many clients only (0: all 500).
    seed: the synthetic data and the model's initial weights.
  """
  if not 1 <= crop <= 32 or max_clients < 0:
    raise ValueError('crop must be in [1, 32] and max_clients >= 0.')
  shape = (crop, crop, 3)
  if model == 'auto':
    model = 'cnn' if source == 'synthetic' else 'resnet18'
  keras_models.check_model_name(model, MODELS)  # before the data is built
  if source == 'tff':
    image_map = tff_preprocessing.build_image_map(shape)

    def examples(dataset: tf.data.Dataset) -> tf.data.Dataset:
      return dataset.map(image_map).map(lambda x, y: (x, tf.cast(y, tf.int32)))

    train, test = (data.preprocess(examples) for data in tff_files.load('cifar100', data_dir))
    train = tff_files.first_clients(train, max_clients)
  elif source == 'synthetic':

    def make(n, key):
      labels = tf.random.stateless_uniform([n], key + 1, 0, CLASSES, tf.int32)
      # Drawn in here, not once outside: TFF's runtime serializes the dataset function,
      # and an eager tensor from outside cannot be captured in its graph.
      templates = tf.random.stateless_normal([CLASSES, *shape], [seed, _TEMPLATES])
      noise = tf.random.stateless_normal([n, *shape], key)
      # Standardized like the real images: each pixel's variance 1.
      return _SIGNAL * tf.gather(templates, labels) + (1 - _SIGNAL**2) ** 0.5 * noise, labels

    train, test = (
      generated.client_data(prefix, tf.fill([clients], CLIENT_SIZE).numpy(), seed, make)
      for prefix, clients in (('train', max_clients or TRAIN_CLIENTS), ('test', TEST_CLIENTS))
    )
  else:
    raise ValueError(f"source={source!r} is unknown; choose 'tff' or 'synthetic'.")
  if model == 'resnet18':
    tf.keras.utils.set_random_seed(seed)
    network = keras_models.from_keras(
      resnet_models.create_resnet18(shape, CLASSES),
      tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
      (tf.TensorSpec([None, *shape], tf.float32), tf.TensorSpec([None], tf.int32)),
    )
  elif model == 'cnn':
    network = models.reshaped_input(models.small_cnn(shape, CLASSES, seed=seed), shape)
  else:
    network = keras_models.registered_classifier(model, shape, CLASSES, seed, built_in=MODELS)
  task = classification.classification_task(
    'cifar100' if source == 'tff' else 'cifar100[synthetic]',
    train,
    test,
    network,
    seed=seed,
    defaults=dict(
      clients_per_round=10, batch_size=20, client_learning_rate=0.1, rounds=4000, eval_period=100
    ),
  )
  return dataclasses.replace(task, resolved_options={'model': model})
