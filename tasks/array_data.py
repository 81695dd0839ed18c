"""Client datasets of in-memory arrays, served from per-client files at the worker.

Generated or shipped data are written once to a cache directory (one raw float32 file
per client: features then label); `ClientData.dataset_computation` then reads a client's
file where the computation runs, so only client ids cross into TFF computations, never
the data (measured: a round reading files costs about half of one that regenerates
the data in-graph, and far less than passing datasets from Python).
"""

from collections.abc import Callable, Sequence
import hashlib
import inspect
import json
import os
import pathlib
import sys
import tempfile

from absl import logging
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_comp import paths

_FORMAT = 2  # the file layout's version (2: checksums in the completion marker)

cache_root = paths.cache_root
# Generated data larger than this is refused before any is made (a mistyped option
# would otherwise try to allocate it).
MAX_BYTES = 8 * 2**30


def check_size(features: int, examples: int) -> None:
  """ValueError if `examples` float32 rows of `features` would exceed MAX_BYTES."""
  size = 4 * features * examples
  if size > MAX_BYTES:
    raise ValueError(
      f'{examples} examples of {features} features would take'
      f' {size / 2**30:.1f} GiB (more than {MAX_BYTES / 2**30:.0f} GiB).'
    )


def file_digest(path: str) -> str:
  """A short content hash of a file (cache keys for data read from user files)."""
  with open(path, 'rb') as f:
    return hashlib.file_digest(f, 'sha256').hexdigest()[:12]


def generator_version(make_client: Callable) -> str:
  """A hash of the source of the module defining `make_client`: part of every cache
  key, so files made by an older generator are never reused."""
  module = sys.modules.get(make_client.__module__)
  try:
    source = inspect.getsource(module) if module else ''
  except (OSError, TypeError):  # no source (an interactive session): never cached stale
    source = repr(make_client.__code__.co_code)
  return hashlib.sha256(f'{_FORMAT}:{source}'.encode()).hexdigest()[:8]


def _file_sums(directory: pathlib.Path, client_ids: Sequence[str]) -> dict[str, str] | None:
  """{client id: sha256 of its file}, or None when a file is missing."""
  sums = {}
  for cid in client_ids:
    path = directory / f'{cid}.f32'
    if not path.is_file():
      return None
    with open(path, 'rb') as f:
      sums[cid] = hashlib.file_digest(f, 'sha256').hexdigest()
  return sums


def _verified(directory: pathlib.Path, client_ids: Sequence[str]) -> bool:
  """Whether the completion marker lists every client file with its current checksum."""
  try:
    recorded = json.loads((directory / 'COMPLETE').read_text())['sha256']
  except (OSError, ValueError, KeyError, TypeError):
    return False
  return recorded == _file_sums(directory, client_ids)


def cached_client_data(
  key: str,
  client_ids: Sequence[str],
  feature_shape: tuple[int, ...],
  label_dtype: tf.DType,
  make_client: Callable[[int], tuple[np.ndarray, np.ndarray]],
) -> tff.simulation.datasets.ClientData:
  """ClientData whose client i has the examples `make_client(i)` = (x, y).

  The files are checked against the checksums written with their completion marker
  at every call: a missing, truncated, emptied or altered file makes the whole set be
  generated again (with a warning), never trained on.

  Args:
    key: identifies the data (task, options, seed); the generator's version
      (`generator_version`) is added to it.
    client_ids: the clients' ids, in the order `make_client` indexes them.
    feature_shape: shape of one example's x.
    label_dtype: dtype of y (stored as float32, cast back on read).
    make_client: deterministic generator of one client's (x [n, ...], y [n]).

  Raises:
    OSError: the files written do not read back (a failing disk); names the file.
  """
  key = f'{key}-g{generator_version(make_client)}'
  digest = hashlib.sha256(key.encode()).hexdigest()[:12]
  directory = cache_root() / f'{key}-{digest}'
  if not _verified(directory, client_ids):
    if (directory / 'COMPLETE').exists():
      logging.warning('data cache %s failed its checksums; generating it again.', directory)
      (directory / 'COMPLETE').unlink(missing_ok=True)
    directory.mkdir(parents=True, exist_ok=True)
    sums = {}
    for i, cid in enumerate(client_ids):
      x, y = make_client(i)
      rows = np.concatenate(
        [x.reshape(len(x), int(np.prod(x.shape[1:]))), y.reshape(len(y), 1)], axis=1
      ).astype(np.float32)
      with tempfile.NamedTemporaryFile(dir=directory, delete=False) as f:
        rows.tofile(f)
      os.replace(f.name, directory / f'{cid}.f32')
      sums[cid] = hashlib.sha256(rows.tobytes()).hexdigest()
    found = _file_sums(directory, client_ids) or {}
    for cid, checksum in sums.items():
      if found.get(cid) != checksum:
        raise OSError(
          f'data cache file {directory / (cid + ".f32")} does not read back what was written.'
        )
    # Atomically: another process (parallel tests) may be checking this cache.
    with tempfile.NamedTemporaryFile('w', dir=directory, delete=False) as f:
      f.write(json.dumps({'sha256': sums}))
    os.replace(f.name, directory / 'COMPLETE')
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

  return tff.simulation.datasets.ClientData.from_clients_and_tf_fn(list(client_ids), dataset_fn)
