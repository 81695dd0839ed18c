"""TFF's runtime: an algorithm's (or any LearningProcess's) rounds on TFF's C++ worker.

The algorithm is composed into a genuine `tff.learning.templates.LearningProcess`
(`composer.compose`; a plugin's or a researcher's hand-built process is taken as it is),
composed with a dataset computation so that `next` takes client ids and each client's
dataset is built where it runs, and run on the local worker that dies with Python
(`runtime.local_worker`) or split across TFF workers (`runtime.workers`, `workers=`).
Registered as the runtime 'tff' (`runtime.base.Runtime`).
"""

from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf
import tensorflow_federated as tff

from tff_comp import registry
from tff_comp.learning_process import chain_factory, client_work, composer
from tff_comp.ops import aggregators
from tff_comp.ops import algorithm as algorithm_lib
from tff_comp.runtime import base, local_worker
from tff_comp.runtime import workers as workers_lib
from tff_comp.settings import ConfigError


def dataset_computation_for(process, client_data, batch_size: int | None = None) -> tff.Computation:
  """The client-id -> dataset computation `process` needs: plain examples (tff_comp's
  client work batches them itself), IndexedExamples when its client work keeps
  per-client server state (AFL), or batches of `batch_size` for a process that takes
  batched datasets (TFF's own algorithms).

  Raises:
    UnsupportedError: the process takes batches and no `batch_size` is given, or the
      ClientData's dataset function is not TF-serializable (`_traced`).
  """
  element = process.next.type_signature.parameter[1].member.element
  if getattr(element, 'python_container', None) is client_work.IndexedExample:
    return _traced(lambda: client_work.indexed_dataset_computation(client_data))
  wanted = tf.nest.flatten(tff.types.type_to_tf_tensor_specs(element))
  stored = tf.nest.flatten(client_data.element_type_structure)
  if [s.shape.rank for s in wanted] != [s.shape.rank + 1 for s in stored]:
    return _traced(lambda: client_data.dataset_computation)
  if batch_size is None:
    raise base.UnsupportedError('this process takes batched datasets; give a batch size.')
  dataset_fn = client_data.serializable_dataset_fn

  def batched():
    return tff.tensorflow.computation(
      lambda client_id: dataset_fn(client_id).batch(batch_size), tf.string
    )

  return _traced(batched)


def _traced(build: Callable[[], tff.Computation]) -> tff.Computation:
  """`build()`, whose tracing of a ClientData's dataset function with a client id
  tensor fails where that function works in Python only (a dict looked up by the id:
  TFF raised a bare `KeyError: <tf.Tensor 'arg:0'>`), said in one line."""
  try:
    return build()
  except (KeyError, TypeError, AttributeError, NotImplementedError, RuntimeError) as e:
    raise base.UnsupportedError(
      "the task's ClientData builds its datasets with Python that a TF graph cannot"
      f" trace ({type(e).__name__}: {str(e)[:80]}): TFF's runtime serializes its"
      ' dataset function (ClientData.from_clients_and_tf_fn with TF ops on the client'
      ' id); run it with --runtime=inprocess, which reads it in Python'
    ) from e


class TFFRuntime:
  """A LearningProcess composed with client ids, run by TFF's runtime (see the module
  docstring); implements `runtime.base.Runtime`."""

  name = 'tff'
  # TFF's process takes client data only: no per-client share of the local work.
  partial_work = False
  sampler = None

  def __init__(
    self,
    process: tff.learning.templates.LearningProcess,
    client_data,
    *,
    workers: Sequence[str] = (),
    batch_size: int | None = None,
  ):
    self.process = process
    self._composed = tff.simulation.compose_dataset_computation_with_learning_process(
      dataset_computation_for(process, client_data, batch_size), process
    )
    if workers:
      workers_lib.check_mergeable(self._composed)
      workers_lib.install_remote_runtime(workers)
      self.description = f'tff on {len(workers)} workers ({", ".join(workers)})'
    else:
      local_worker.ensure_local_runtime()
      self.description = 'tff'
    self.record = {'name': self.name, 'workers': list(workers)}
    self.keeps_personal_models = isinstance(process, composer.PersonalizedLearningProcess)

  def initialize(self) -> base.State:
    return self._composed.initialize()

  def next(
    self, state: base.State, client_ids: Sequence[str], work: Sequence[float] | None = None
  ) -> base.RoundOutput:
    if work is not None and min(work) < 1:
      raise base.UnsupportedError(
        'stragglers (clients doing part of their local work) run in-process only.'
      )
    output = self._composed.next(state, list(client_ids))
    return base.RoundOutput(output.state, output.metrics)

  def reserve_cohort(self, size: int) -> None:
    """A no-op: TFF's computations take cohorts of any size."""

  def prefetch(self, client_ids: Sequence[str]) -> None:
    """A no-op: each client's dataset is built where it runs."""

  def get_model_weights(self, state: base.State) -> Any:
    return self._composed.get_model_weights(state)

  def get_hparams(self, state: base.State) -> Any:
    return self._composed.get_hparams(state)

  def set_hparams(self, state: base.State, hparams: Any) -> base.State:
    return self._composed.set_hparams(state, hparams)

  def get_personal_weights(self, state: base.State) -> Any:
    if not self.keeps_personal_models:
      return None
    return self.process.get_personal_weights(state)

  def whole_state(self, state: base.State) -> base.State:
    return state


def build_tff(
  program, client_data, *, workers: Sequence[str] = (), batch_size: int | None = None
) -> TFFRuntime:
  """TFF's runtime for an Algorithm (composed here) or a LearningProcess.

  Args:
    workers: host:port of TFF workers splitting each round's clients (empty: the local
      worker).
    batch_size: examples per batch for a process that takes batched datasets (TFF's
      own algorithms); tff_comp's algorithms batch client data themselves.

  Raises:
    workers.NotMergeableError, workers.WorkerError: the rounds cannot be split across
      `workers`, or a worker does not answer.
  """
  process = composer.compose(program) if isinstance(program, algorithm_lib.Algorithm) else program
  return TFFRuntime(process, client_data, workers=workers, batch_size=batch_size)


def why_not(program, options: workers_lib.WorkerOptions | None = None) -> str:
  """Why TFF's process cannot run `program` ('' when it can): an aggregator chain whose
  clients would need state between rounds (`chain_factory.why_not`)."""
  del options
  chain = getattr(program, 'model_aggregator', None)
  return chain_factory.why_not(chain) if isinstance(chain, aggregators.Chain) else ''


@registry.register_runtime('tff', options=workers_lib.WorkerOptions, auto_rank=1, why_not=why_not)
def build_from_settings(
  program, client_data, options: workers_lib.WorkerOptions, facts: base.RunFacts
) -> TFFRuntime:
  """`build_tff` with the run's settings.

  Raises:
    ConfigError: the rounds cannot be split across the workers, or one does not answer.
  """
  try:
    return build_tff(program, client_data, workers=options.workers, batch_size=facts.batch_size)
  except (workers_lib.NotMergeableError, workers_lib.WorkerError) as e:
    raise ConfigError(f'--workers: {e}') from e
