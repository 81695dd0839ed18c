"""MNIST and CIFAR-10 for users with network access, or from a local .npz.

`load_images(name, path)` reads `x_train`/`y_train` from an .npz in Keras' format when
`path` is given (offline, and how the tests exercise this code), else downloads once
through `tf.keras.datasets` (cached under ~/.keras). Images are flattened and scaled to
[0, 1]; labels are int32.
"""

import pathlib

import numpy as np
import tensorflow as tf

from tff_comp import paths

_KERAS = {'mnist': tf.keras.datasets.mnist, 'cifar10': tf.keras.datasets.cifar10}


def load_images(name: str, path: str = '') -> tuple[np.ndarray, np.ndarray]:
  """(x [n, features] in [0, 1], y [n] int32) training images of `name`."""
  if name not in _KERAS:
    raise ValueError(f'unknown image dataset {name!r}; choose one of {sorted(_KERAS)}.')
  if path:
    paths.note_data_file(pathlib.Path(path))
    with np.load(path) as data:
      x, y = data['x_train'], data['y_train']
  else:
    (x, y), _ = _KERAS[name].load_data()
  return (x.reshape(len(x), -1) / 255.0).astype(np.float32), y.reshape(-1).astype(np.int32)
