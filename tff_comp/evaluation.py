"""What scores a run's states: the task's evaluation of the global model and, for a
runtime with personal models (Ditto), each client's own."""

from collections.abc import Callable
from typing import Any, TYPE_CHECKING

from tff_comp.runtime import base as runtime_base
from tff_comp.settings import ConfigError

if TYPE_CHECKING:
  from tff_comp.experiment import Prepared  # pylint: disable=g-bad-import-order

def evaluator(prepared: 'Prepared', runtime: runtime_base.Runtime
              ) -> Callable[[Any], dict[str, float]]:
  """(state -> the task's metrics): the global model's, and for a runtime with personal
  models (Ditto) each client's own model's, with the run's regularizer.

  Raises:
    ConfigError: the runtime has personal models and the task cannot score them.
  """
  task = prepared.task
  psi = prepared.builder_args.get('regularizer', task.regularizer)
  personalized = runtime.keeps_personal_models
  if personalized and task.evaluate_personal is None:
    raise ConfigError(
        f'algorithm {prepared.config.algorithm!r} trains a personal model per client;'
        f' task {task.name!r} cannot evaluate them (its evaluation clients are not its'
        ' training clients). Try --task=dominant_class.')
  client_ids = task.train_data.client_ids

  def evaluate(state) -> dict[str, float]:
    metrics = task.evaluate(tuple(runtime.get_model_weights(state).trainable), psi)
    if personalized:
      tables = runtime.get_personal_weights(state)
      metrics.update(task.evaluate_personal(
          {cid: tuple(t[i] for t in tables) for i, cid in enumerate(client_ids)}))
    return metrics

  return evaluate


def client_evaluator(prepared: 'Prepared', runtime: runtime_base.Runtime
                     ) -> Callable[[Any], list[dict]] | None:
  """state -> the task's per-client evaluation rows of the global model (with each
  client's own model's `personal_*` scores for a runtime with personal models), or None
  for a task without per-client evaluation data."""
  task = prepared.task
  if task.evaluate_clients is None:
    return None
  personal = (task.evaluate_personal_clients if runtime.keeps_personal_models else None)
  client_ids = task.train_data.client_ids

  def evaluate_clients(state) -> list[dict]:
    rows = task.evaluate_clients(tuple(runtime.get_model_weights(state).trainable))
    if personal is not None:
      tables = runtime.get_personal_weights(state)
      own = {row['client']: row for row in personal(
          {cid: tuple(t[i] for t in tables) for i, cid in enumerate(client_ids)})}
      rows = [dict(row, **own.get(row['client'], {})) for row in rows]
    return rows

  return evaluate_clients
