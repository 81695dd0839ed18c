"""ClientData generated on demand, for shape-identical synthetic stand-ins of datasets
whose files are absent (`--<task>_source=synthetic`): nothing is stored, each client's
examples are drawn when its dataset is built, from the seed and its index."""

from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff


def lognormal_sizes(clients: int, mean: float, seed: int, sigma: float = 0.5) -> np.ndarray:
  """Client sizes (at least 1) lognormal with mean `mean` and log-scale spread `sigma`."""
  rng = np.random.default_rng(seed)
  return np.maximum(1, rng.lognormal(np.log(mean) - sigma**2 / 2, sigma, clients)).astype(np.int32)


def client_data(
  prefix: str, sizes: np.ndarray, seed: int, make: Callable[[tf.Tensor, tf.Tensor], Any]
) -> tff.simulation.datasets.ClientData:
  """Clients `<prefix>_<i>` whose datasets are the slices of `make(n, key)` (tensors of
  n examples drawn with the stateless [2] `key`), n = sizes[i]."""
  salt = sum(map(ord, prefix))

  def dataset_fn(client_id):
    index = tf.strings.to_number(tf.strings.split(client_id, '_')[-1], tf.int32)
    key = tf.stack([seed * 1000 + salt, index])
    # The sizes become a constant of whichever graph traces this (TFF's runtime
    # serializes it; an eager tensor made once outside could not be captured there).
    return tf.data.Dataset.from_tensor_slices(make(tf.gather(sizes, index), key))

  return tff.simulation.datasets.ClientData.from_clients_and_tf_fn(
    [f'{prefix}_{i}' for i in range(len(sizes))], dataset_fn
  )
