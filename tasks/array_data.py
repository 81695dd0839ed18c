"""Client datasets of in-memory arrays, served from per-client files at the worker.

Generated or shipped data are written once to a cache directory (one raw float32 file
per client: features then label); `ClientData.dataset_computation` then reads a client's
file where the computation runs, so only client ids cross into TFF computations, never
the data (measured: a round reading files costs about half of one that regenerates
the data in-graph, and far less than passing datasets from Python).
"""

from collections.abc import Callable, Sequence
import hashlib
import os
import pathlib
import tempfile

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

_CACHE_ENV = 'TFF_COMP_DATA_DIR'


def cache_root() -> pathlib.Path:
  """$TFF_COMP_DATA_DIR, else ~/.cache/tff_comp."""
  root = os.environ.get(_CACHE_ENV) or os.path.join(
      os.path.expanduser('~'), '.cache', 'tff_comp'
  )
  return pathlib.Path(root)


def file_digest(path: str) -> str:
  """A short content hash of a file (cache keys for data read from user files)."""
  with open(path, 'rb') as f:
    return hashlib.file_digest(f, 'sha256').hexdigest()[:12]


def cached_client_data(
    key: str,
    client_ids: Sequence[str],
    feature_shape: tuple[int, ...],
    label_dtype: tf.DType,
    make_client: Callable[[int], tuple[np.ndarray, np.ndarray]],
) -> tff.simulation.datasets.ClientData:
  """ClientData whose client i has the examples `make_client(i)` = (x, y).

  Args:
    key: identifies the data (task, options, seed); files are rebuilt when absent.
    client_ids: the clients' ids, in the order `make_client` indexes them.
    feature_shape: shape of one example's x.
    label_dtype: dtype of y (stored as float32, cast back on read).
    make_client: deterministic generator of one client's (x [n, ...], y [n]).
  """
  digest = hashlib.sha256(key.encode()).hexdigest()[:12]
  directory = cache_root() / f'{key}-{digest}'
  done = directory / 'COMPLETE'
  if not done.exists():
    directory.mkdir(parents=True, exist_ok=True)
    for i, cid in enumerate(client_ids):
      x, y = make_client(i)
      rows = np.concatenate(
          [x.reshape(len(x), -1), y.reshape(len(y), 1)], axis=1
      ).astype(np.float32)
      with tempfile.NamedTemporaryFile(dir=directory, delete=False) as f:
        rows.tofile(f)
      os.replace(f.name, directory / f'{cid}.f32')
    done.touch()
  width = int(np.prod(feature_shape)) + 1
  prefix = str(directory) + os.sep

  def dataset_fn(client_id: tf.Tensor) -> tf.data.Dataset:
    raw = tf.io.decode_raw(
        tf.io.read_file(tf.strings.join([prefix, client_id, '.f32'])), tf.float32
    )
    rows = tf.reshape(raw, [-1, width])
    x = tf.reshape(rows[:, :-1], [-1, *feature_shape])
    y = tf.cast(rows[:, -1], label_dtype)
    return tf.data.Dataset.from_tensor_slices((x, y))

  return tff.simulation.datasets.ClientData.from_clients_and_tf_fn(
      list(client_ids), dataset_fn
  )
