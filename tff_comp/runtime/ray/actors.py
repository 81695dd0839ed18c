"""The Ray runtime's actors: each holds a share of the clients and runs their work on
the in-process runtime (`Shard`), pooled per process; and what travels to them (the
algorithm pickled, a shard's client data)."""

from collections.abc import Sequence
import io
import os
from typing import Any, NamedTuple

import numpy as np
import tensorflow as tf

from tff_comp.runtime import client_rows, inprocess
from tff_comp.runtime.inprocess import streaming
from tff_comp.runtime.ray import cluster as ray_cluster

# The lanes engine's threads in an actor: the actors, several to a host, are the
# parallelism (`inprocess.InProcessOptions.kernel_threads`).
ACTOR_KERNEL_THREADS = 1


class Shard:
  """An actor's part of the clients: the in-process runtime of an algorithm on those
  clients alone (`setup`), with the engine the whole run takes. Ray runs it as an actor
  (`ray.remote(Shard)`), set up again for each run that uses it; a plain class, so it
  runs and is tested in-process too."""

  def __init__(self):
    self.runtime: inprocess.InProcessRuntime | None = None
    self.rows = client_rows.ShardRows()  # its clients' rows of client state

  def setup(
    self, algorithm: bytes, client_data, engine: str, data_memory_budget: float, capacity: int
  ) -> None:
    """`algorithm`: the Algorithm pickled (`build`)."""
    if isinstance(client_data, Examples):
      client_data = client_data.client_data()
    self.runtime = inprocess.build(
      ray_cluster.ray_module().cloudpickle.loads(algorithm),
      client_data,
      engine=engine,
      data_memory_budget=data_memory_budget,
      kernel_threads=ACTOR_KERNEL_THREADS,
    )
    self.runtime.reserve_cohort(capacity)
    self.rows = client_rows.ShardRows()

  def restore(self, shard, *changes) -> None:
    """Its rows of client state: `shard` (population indices, {field: their rows}),
    then each of `changes` (rows of some of them) in order."""
    self.rows.load(shard)
    for change in changes:
      self.rows.commit(change)

  def commit(self, change) -> None:
    """Writes the new rows of its clients of a round (`ShardRows.commit`)."""
    self.rows.commit(change)

  def snapshot(self) -> tuple[np.ndarray, dict[str, Any]]:
    """Its rows of client state (as `restore` takes them)."""
    return self.rows.indices, self.rows.tables

  def pid(self) -> int:
    return os.getpid()

  def reserve_cohort(self, size: int) -> None:
    self._runtime().reserve_cohort(size)

  def client_sums(
    self, payload, hparams, client_ids, work, indices, round_num, reference, aggregator
  ):
    """(the clients' sums, with their rows of the slot tables alone; their rows of
    client state as the round found them) from a payload holding their rows of the
    per-client tables (`client_rows`: a held table's filled here)."""
    sums = self.runtime.client_sums(
      self._payload(payload), hparams, client_ids, work, indices, round_num, reference, aggregator
    )
    return (
      client_rows.select_sums(sums, self.runtime.algorithm.aggregation, indices),
      self.rows.take(np.unique(np.asarray(indices, np.int64))),
    )

  def reference_candidates(self, payload, hparams, client_ids) -> np.ndarray:
    return self._runtime().reference_candidates(self._payload(payload), hparams, client_ids)

  def _runtime(self) -> inprocess.InProcessRuntime:
    """The runtime `set_up` built (the driver sets every actor up before a round)."""
    if self.runtime is None:
      raise RuntimeError('a Ray shard was called before set_up.')
    return self.runtime

  def _payload(self, payload):
    return client_rows.expand(self.rows.fill(payload))


# This process's actors, by (cluster, count, GPUs each): their processes (and the
# TensorFlow each imported) serve every run after the first.
POOL: dict[tuple[str, int, float], list[Any]] = {}
# The runtime each pool's actors are set up for (`RayRuntime._take_actors`).
SERVING: dict[tuple[str, int, float], int] = {}


def pool_key(ray, count: int, gpus: float) -> tuple[str, int, float]:
  return (ray.get_runtime_context().get_job_id(), count, gpus)


def actor_pool(ray, count: int, gpus: float) -> list[Any]:
  key = pool_key(ray, count, gpus)
  if key not in POOL:
    actor = ray.remote(
      num_cpus=0, num_gpus=gpus, max_restarts=ray_cluster.RETRIES, max_task_retries=0
    )(Shard)
    POOL[key] = [actor.remote() for _ in range(count)]
  return POOL[key]


def _function(
  python_function, input_signature, autograph: bool, jit_compile, reduce_retracing: bool
):
  return tf.function(
    python_function,
    input_signature=input_signature,
    autograph=autograph,
    jit_compile=jit_compile,
    reduce_retracing=reduce_retracing,
  )


def dumps(algorithm) -> bytes:
  """`algorithm` pickled (Ray's cloudpickle) with each `tf.function` as its definition,
  not its traces: a traced one (the task's model once a run used it) holds graphs that
  do not pickle, and TensorFlow's own `Function.__getstate__` keeps them. The options
  are read from the Function's attributes (TF 2.14 has no public accessor for them)."""
  from tensorflow.python.eager.polymorphic_function import polymorphic_function

  # Ray's pickler, imported with Ray when a run asks for it: a base mypy cannot see.
  class Pickler(ray_cluster.ray_module().cloudpickle.CloudPickler):  # type: ignore[misc]
    def reducer_override(self, obj):
      if isinstance(obj, polymorphic_function.Function):
        return _function, (
          obj.python_function,
          obj.input_signature,
          obj._autograph,
          obj._jit_compile,
          obj._reduce_retracing,
        )
      return super().reducer_override(obj)

  buffer = io.BytesIO()
  Pickler(buffer).dump(algorithm)
  return buffer.getvalue()


class Examples(NamedTuple):
  """A shard's clients' examples as NumPy arrays, for a ClientData whose dataset
  function does not pickle; the actor builds its ClientData from them."""

  examples: dict[str, Any]

  def client_data(self):
    import tensorflow_federated as tff

    return tff.simulation.datasets.TestClientData(self.examples)


def sub_data(client_data, client_ids: Sequence[str]):
  """The clients `client_ids` of `client_data`, as a ClientData of their own. Built on
  its dataset function alone, so what it carries to an actor is that function (a
  ClientData may hold a TFF computation of its own once used on TFF's runtime, which
  does not pickle); where that function does not pickle either (TFF's TestClientData
  holds its ClientData), the clients' examples as arrays (`Examples`)."""
  import tensorflow_federated as tff

  sub = tff.simulation.datasets.ClientData.from_clients_and_tf_fn(
    list(client_ids), client_data.serializable_dataset_fn
  )
  try:
    ray_cluster.ray_module().cloudpickle.dumps(sub)
    return sub
  except Exception:  # Ray's pickler raises several kinds
    return Examples({c: streaming.read_client(client_data, c) for c in client_ids})
