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


# The chain's successors of an id and how likely each is: the best possible next-id
# accuracy is 0.6, against 1/V for uniform ids.
MARKOV_PROBABILITIES = (0.6, 0.3, 0.1)


def markov_sequences(n: tf.Tensor, key: tf.Tensor, chain_key: tf.Tensor, ids: int, length: int):
  """[n, length] sequences of ids in [1, ids), each a walk of one Markov chain drawn with
  `chain_key` (every id has `len(MARKOV_PROBABILITIES)` successors, taken with those
  probabilities) from a uniform first id; the walks are drawn with `key`. The chain is
  made here, inside whichever graph calls this, not captured from outside."""
  successors = tf.random.stateless_uniform(
    [ids, len(MARKOV_PROBABILITIES)], chain_key, 1, ids, tf.int32
  )
  keys = tf.random.experimental.stateless_split(key, length)
  logits = tf.broadcast_to(
    tf.math.log(tf.constant([MARKOV_PROBABILITIES])), tf.stack([n, len(MARKOV_PROBABILITIES)])
  )

  def step(previous, step_key):
    choice = tf.random.stateless_categorical(logits, 1, step_key, dtype=tf.int32)[:, 0]
    return tf.gather_nd(successors, tf.stack([previous, choice], 1))

  first = tf.random.stateless_uniform(tf.reshape(n, [1]), keys[0], 1, ids, tf.int32)
  walk = tf.scan(step, keys[1:], initializer=first)
  return tf.transpose(tf.concat([first[None], walk], 0))


def bigram_model(
  ids: int, length: int, initializer: str | tf.keras.initializers.Initializer = 'uniform'
) -> tf.keras.Model:
  """The model a first-order chain of `ids` ids needs (`markov_sequences`): each of
  `length` positions' next id from its own id alone (Embedding 16 drawn by
  `initializer`, Keras's default by default, then Dense to the ids)."""
  return tf.keras.Sequential(
    [
      tf.keras.layers.InputLayer((length,)),
      tf.keras.layers.Embedding(ids, 16, embeddings_initializer=initializer),
      tf.keras.layers.Dense(ids),
    ]
  )
