"""Client data as arrays: every client's examples read once from a `ClientData` into
NumPy, as the in-process runtimes hold them and as tasks score them."""

from typing import Any, NamedTuple

import numpy as np
import tensorflow as tf

from tff_comp.ops import local_loop


class ClientArrays(NamedTuple):
  """Every client's examples concatenated in client order (a structure of [total, ...]
  arrays; no padding, so heavy-tailed client sizes cost no memory), with the number of
  examples of each client."""

  examples: Any
  counts: np.ndarray
  client_ids: tuple[str, ...]


def client_arrays(client_data) -> ClientArrays:
  """All clients of a `tff.simulation.datasets.ClientData` as NumPy arrays."""
  ids = tuple(client_data.client_ids)
  per_client = []
  for cid in ids:  # each client's examples as one batch (iterating them is far slower)
    whole = local_loop.materialize(client_data.create_tf_dataset_for_client(cid))
    per_client.append(tf.nest.map_structure(np.asarray, whole))
  counts = np.array([len(tf.nest.flatten(c)[0]) for c in per_client], np.int32)
  examples = tf.nest.map_structure(lambda *a: np.concatenate(a), *per_client)
  return ClientArrays(examples, counts, ids)
