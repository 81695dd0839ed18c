"""`data.client_arrays` holds each client's examples as its ClientData gives them, in
client order, whether its dataset function is traced once (TF ops on the client id) or
works in Python only (built client by client)."""

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_comp import data
from tff_comp.tasks import generated


def _iterated(client_data) -> tuple[list, list]:
  """Every client's examples by iterating its dataset element by element (the
  reference), concatenated in client order, and the clients' sizes."""
  per_client = [
    [tf.nest.map_structure(np.asarray, e) for e in client_data.create_tf_dataset_for_client(c)]
    for c in client_data.client_ids
  ]
  flat = [tf.nest.flatten(e) for examples in per_client for e in examples]
  return [np.stack(column) for column in zip(*flat, strict=True)], [len(c) for c in per_client]


def _generated() -> tff.simulation.datasets.ClientData:
  """Twelve clients of lognormal sizes drawn statelessly from their ids, preprocessed."""

  def make(n, key):
    return (
      tf.random.stateless_uniform([n, 3], key),
      tf.random.stateless_uniform([n], key + 1, 0, 5, tf.int32),
    )

  raw = generated.client_data('train', generated.lognormal_sizes(12, 9.0, 1), 7, make)
  return raw.preprocess(lambda d: d.map(lambda x, y: (2.0 * x, y)))


def test_a_traced_dataset_function_reads_every_clients_examples_in_order():
  client_data = _generated()
  arrays = data.client_arrays(client_data)
  reference, sizes = _iterated(client_data)
  assert arrays.client_ids == tuple(client_data.client_ids)
  np.testing.assert_array_equal(arrays.counts, sizes)
  assert len(set(sizes)) > 1
  for got, want in zip(tf.nest.flatten(arrays.examples), reference, strict=True):
    np.testing.assert_array_equal(got, want)


def test_a_python_only_dataset_function_reads_client_by_client():
  """A dataset function looking its client up in a Python dict cannot be traced with a
  client id tensor: read client by client, the same arrays."""
  source = _generated()
  tables = {
    c: tuple(np.stack(t) for t in zip(*source.create_tf_dataset_for_client(c).as_numpy_iterator()))
    for c in source.client_ids
  }
  python_only = tff.simulation.datasets.ClientData.from_clients_and_tf_fn(
    list(tables), lambda cid: tf.data.Dataset.from_tensor_slices(tables[cid])
  )
  arrays = data.client_arrays(python_only)
  reference, sizes = _iterated(source)
  np.testing.assert_array_equal(arrays.counts, sizes)
  for got, want in zip(tf.nest.flatten(arrays.examples), reference, strict=True):
    np.testing.assert_array_equal(got, want)
