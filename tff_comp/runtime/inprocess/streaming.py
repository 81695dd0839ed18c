"""Streamed client data for the in-process runtime: only the round's cohort on the device.

`resident_data.ResidentData` copies every client's examples to the device once. For a
population larger than memory (StackOverflow's 342,477 clients), `StreamedData` holds
only the current cohort's examples: `load(client_ids)` reads them from the
`ClientData` (e.g. TFF's SQLite files) into the same variables, reshaped to the cohort,
and `prefetch(client_ids)` reads the next round's cohort on a background thread while
the current round runs. Host and device memory are then bounded by a cohort's data. A
client's examples, order and key (`local_loop.client_key`, from its data) are those of
the resident copy, so both give the same rounds.

`estimate_bytes` sizes a population's resident copy from a sample of its clients, so
`inprocess.build` can choose between the two against a memory budget.
"""

from collections.abc import Sequence
import concurrent.futures
from typing import Any

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_comp.ops import local_loop
from tff_comp.runtime.inprocess import resident_data

_MAX_COHORT = 1 << 20  # more clients than any round has


def read_client(client_data: tff.simulation.datasets.ClientData, client_id: str) -> Any:
  """One client's examples as a structure of NumPy arrays."""
  return tf.nest.map_structure(
    np.asarray, local_loop.materialize(client_data.create_tf_dataset_for_client(client_id))
  )


# Set on a ClientData whose dataset function takes Python ids only (batched trials'
# merged seeds): streaming reads cohorts in a tf.data map, by tensor ids.
_PYTHON_IDS = '_tff_comp_python_ids'


def resident_only(client_data: tff.simulation.datasets.ClientData):
  """`client_data`, marked as readable by Python ids only (`streams`)."""
  setattr(client_data, _PYTHON_IDS, True)
  return client_data


def streams(client_data: tff.simulation.datasets.ClientData) -> bool:
  """Whether cohorts of `client_data` can be streamed (`resident_only`: not)."""
  return not getattr(client_data, _PYTHON_IDS, False)


def estimate_bytes(client_data: tff.simulation.datasets.ClientData, sample: int = 20) -> int:
  """The bytes of every client's examples, from `sample` clients spread over the ids."""
  ids = list(client_data.client_ids)
  picked = np.unique(np.linspace(0, len(ids) - 1, min(sample, len(ids))).astype(int))
  sizes = [sum(a.nbytes for a in tf.nest.flatten(read_client(client_data, ids[i]))) for i in picked]
  return int(np.mean(sizes) * len(ids))


class StreamedData(resident_data.ResidentData):
  """The cohort's examples on `device` (see the module docstring); the interface of
  `resident_data.ResidentData`, its `index` mapping the loaded clients' ids to positions."""

  def __init__(
    self, client_data: tff.simulation.datasets.ClientData, device: str, *, with_keys: bool
  ):
    self._client_data, self._with_keys = client_data, with_keys
    self.client_ids = tuple(client_data.client_ids)
    self.index: dict[str, int] = {}
    first = read_client(client_data, self.client_ids[0])
    with tf.device(device):
      self.examples = tf.nest.map_structure(
        lambda a: tf.Variable(a, trainable=False, shape=tf.TensorShape([None, *a.shape[1:]])), first
      )
      self.counts, self.offsets, self.keys = (
        tf.Variable(tf.zeros([0], dtype), trainable=False, shape=tf.TensorShape([None]))
        for dtype in (tf.int32, tf.int32, tf.int64)
      )
    # Traced once for cohorts of every size: shapes other than the examples' own
    # dimensions are left open (without, `_keys` traced again for every cohort).
    examples_spec = tf.nest.map_structure(
      lambda a: tf.TensorSpec([None, *a.shape[1:]], a.dtype), first
    )
    self._read_cohort = tf.function(
      self._cohort_examples, autograph=False, input_signature=[tf.TensorSpec([None], tf.string)]
    )
    self._keys_of = tf.function(
      _keys, autograph=False, input_signature=[examples_spec, tf.TensorSpec([None], tf.int32)]
    )
    self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    # Reads started by `prefetch`, by their clients: the simulation loop asks for the
    # next round's before this round's `load`, so two can be pending.
    self._pending: dict[frozenset[str], tuple[tuple[str, ...], concurrent.futures.Future]] = {}
    self.load(self.client_ids[:1])

  def _cohort_examples(self, client_ids: tf.Tensor) -> tuple[tf.Tensor, Any]:
    """(the clients' example counts, their examples concatenated in order): each
    client's dataset read whole, in parallel, into one ragged batch, traced once (faster
    than a dataset a client or tagging each example with its client)."""
    make = self._client_data.serializable_dataset_fn
    cohort = (
      tf.data.Dataset.from_tensor_slices(client_ids)
      .map(
        lambda cid: local_loop.materialize(make(cid)),
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=True,
      )
      .ragged_batch(_MAX_COHORT)
      .get_single_element()
    )
    return (
      tf.cast(tf.nest.flatten(cohort)[0].row_lengths(), tf.int32),
      tf.nest.map_structure(lambda ragged: ragged.values, cohort),
    )

  def _read(self, client_ids: tuple[str, ...]) -> tuple[tf.Tensor, Any, tf.Tensor]:
    """(the clients' example counts, their examples concatenated in order, their
    keys), all computed here, on the prefetching thread when there is one."""
    counts, examples = self._read_cohort(tf.constant(client_ids))
    keys = (
      self._keys_of(examples, counts) if self._with_keys else tf.zeros([len(client_ids)], tf.int64)
    )
    return counts, examples, keys

  def prefetch(self, client_ids: Sequence[str]) -> None:
    """Starts reading the clients `client_ids` (the next round's) in the background."""
    unique = tuple(dict.fromkeys(client_ids))
    if unique and frozenset(unique) not in self._pending:
      while len(self._pending) >= 2:  # the oldest (a round that did not run) is dropped
        del self._pending[next(iter(self._pending))]
      self._pending[frozenset(unique)] = (unique, self._pool.submit(self._read, unique))

  def load(self, client_ids: Sequence[str]) -> None:
    """Puts the clients `client_ids` (an id given twice is loaded once) on the device."""
    unique = tuple(dict.fromkeys(client_ids))
    if set(unique) == set(self.index):
      return
    if frozenset(unique) in self._pending:
      unique, read = self._pending.pop(frozenset(unique))
      counts, examples, keys = read.result()
    else:
      counts, examples, keys = self._read(unique)
    tf.nest.map_structure(lambda variable, value: variable.assign(value), self.examples, examples)
    self.counts.assign(counts)
    self.offsets.assign(tf.cumsum(counts, exclusive=True))
    self.keys.assign(keys)
    self.index = {cid: i for i, cid in enumerate(unique)}


def _keys(examples: Any, counts: tf.Tensor) -> tf.Tensor:
  """Each client's `local_loop.client_key`, from examples concatenated in client order."""
  offsets = tf.cumsum(counts, exclusive=True)
  return tf.map_fn(
    lambda i: local_loop.client_key(
      tf.nest.map_structure(lambda t: t[offsets[i] : offsets[i] + counts[i]], examples)
    ),
    tf.range(tf.shape(counts)[0]),
    fn_output_signature=tf.int64,
  )
