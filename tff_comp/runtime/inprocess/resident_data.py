"""Where the in-process runtime's clients and kernels live: every client's examples
resident on the device (`ResidentData`), the device (`choose_device`) and the lanes
kernels' threads (`kernel_threads`)."""

from collections.abc import Sequence
import os
from typing import Any

import numpy as np
import tensorflow as tf

from tff_comp.ops import local_loop
from tff_comp.runtime.inprocess import huge_pages


def choose_device(logical_devices: Sequence[Any] | None = None) -> str:
  """The device name rounds run on: the first logical GPU, else the first CPU."""
  devices = tf.config.list_logical_devices() if logical_devices is None else logical_devices
  for kind in ('GPU', 'CPU'):
    for device in devices:
      if device.device_type == kind:
        return device.name
  raise RuntimeError('TensorFlow sees no CPU or GPU device.')


def kernel_threads(device: str, requested: int = 0) -> int:
  """Threads the lanes engine runs a cohort's kernels on (`LanesEngine`): `requested`,
  or 0 for one on a GPU and on a CPU the cores this process may use, at most the
  threads of TensorFlow's inter-op pool (which runs them; 0 there: one a core)."""
  if requested:
    return requested
  if 'GPU' in device.upper():
    return 1
  cores = len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count()
  cores = cores or 1
  pool: int = tf.config.threading.get_inter_op_parallelism_threads() or cores
  return max(1, min(cores, pool))


@tf.function(autograph=False, reduce_retracing=True)
def _client_keys(examples: Any, counts: tf.Tensor) -> tf.Tensor:
  """Each client's `local_loop.client_key`, its examples the `counts` concatenated in
  `examples`. One function for every build (a function per build traced anew each
  time, and TensorFlow warned of retracing after five builds in a process)."""
  offsets = tf.cumsum(counts, exclusive=True)
  return tf.map_fn(
    lambda i: local_loop.client_key(
      tf.nest.map_structure(lambda v: v[offsets[i] : offsets[i] + counts[i]], examples)
    ),
    tf.range(tf.shape(counts)[0]),
    fn_output_signature=tf.int64,
  )


class ResidentData:
  """Every client's examples resident on `device` in variables (never constants in a
  graph): concatenated in client order (no padding, so heavy-tailed client sizes cost
  no memory), with each client's offset, count and `local_loop.client_key`; on a CPU
  on 2 MB pages where Linux allows (`huge_pages`: whether it did)."""

  def __init__(
    self,
    examples: Any,
    counts: np.ndarray,
    client_ids: tuple[str, ...],
    device: str,
    *,
    with_keys: bool,
  ):
    self.client_ids = client_ids
    self.index = {cid: i for i, cid in enumerate(client_ids)}
    with tf.device(device):
      self.examples = tf.nest.map_structure(lambda a: tf.Variable(a, trainable=False), examples)
      self.counts = tf.Variable(counts, trainable=False)
      self.offsets = tf.Variable((np.cumsum(counts) - counts).astype(np.int32), trainable=False)
      keys = (
        _client_keys(examples, counts)
        if with_keys and len(counts)
        else tf.zeros([len(counts)], tf.int64)
      )
      self.keys = tf.Variable(keys, trainable=False)
    self.huge_pages = huge_pages.advise(self.examples)

  def client_examples(self, index) -> Any:
    start, count = self.offsets[index], self.counts[index]
    return tf.nest.map_structure(lambda v: v[start : start + count], self.examples)

  def map_clients(self, fn, indices: tf.Tensor, *, like=None) -> Any:
    """[fn(p, indices[p], examples of client indices[p]) for each position p],
    stacked on a leading axis. `like`: a cheaper function of the same arguments whose
    outputs have `fn`'s structure, dtypes and shapes (traced for the outputs' spec in
    place of `fn`)."""

    def at_position(client_fn):
      def one(position):
        index = tf.gather(indices, position)
        return client_fn(position, index, self.client_examples(index))

      return one

    # The outputs' spec from a trace of its own (map_fn's body calling a concrete
    # function instead cost more a client on lasso than the client's steps).
    spec = tf.nest.map_structure(
      lambda t: tf.TensorSpec(t.shape, t.dtype),
      tf.function(at_position(like or fn), autograph=False)
      .get_concrete_function(tf.TensorSpec([], tf.int32))
      .structured_outputs,
    )
    return tf.map_fn(
      at_position(fn),
      tf.range(tf.shape(indices)[0]),
      fn_output_signature=spec,
      parallel_iterations=int(indices.shape[0] or 10),
    )
