"""What scores a run's states: the task's evaluation of the global model and, for a
runtime with personal models (Ditto), each client's own."""

from collections.abc import Callable
from typing import Any

from tff_comp.runtime import base as runtime_base
from tff_comp.settings import ConfigError


def evaluator(task, runtime: runtime_base.Runtime, *, regularizer=None, algorithm: str = ''
              ) -> Callable[[Any], dict[str, float]]:
  """(state -> the task's metrics): the global model's, and for a runtime with personal
  models (Ditto) each client's own model's, with the run's `regularizer` (None: the
  task's); `algorithm` names the algorithm in the error.

  Raises:
    ConfigError: the runtime has personal models and the task cannot score them.
  """
  psi = task.regularizer if regularizer is None else regularizer
  personalized = runtime.keeps_personal_models
  if personalized and task.evaluate_personal is None:
    raise ConfigError(
        f'algorithm {algorithm!r} trains a personal model per client;'
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


def client_evaluator(task, runtime: runtime_base.Runtime
                     ) -> Callable[[Any], list[dict]] | None:
  """state -> the task's per-client evaluation rows of the global model (with each
  client's own model's `personal_*` scores for a runtime with personal models), or None
  for a task without per-client evaluation data."""
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
