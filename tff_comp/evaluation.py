"""What scores a run's states: the task's evaluation of the global model and, for a
runtime with personal models (Ditto), each client's own."""

from collections.abc import Callable, Sequence
import functools
from typing import Any

from tff_comp import task as task_lib
from tff_comp.runtime import base as runtime_base
from tff_comp.settings import ConfigError


class Evaluation:
  """state -> the task's metrics: the global model's, and for a runtime with personal
  models (Ditto) each client's own model's, with the run's `psi`. `evaluate_together`
  scores several runs' states at once where their task can (`Task.evaluate_many`)."""

  def __init__(self, task: task_lib.Task, runtime: runtime_base.Runtime, psi):
    self.task, self.runtime, self.psi = task, runtime, psi
    self._personalized = runtime.keeps_personal_models

  def model(self, state) -> tuple[Any, Any]:
    """(the global model's trainable weights, psi): what the task scores."""
    return tuple(self.runtime.get_model_weights(state).trainable), self.psi

  def personal(self, state, metrics: dict[str, float]) -> dict[str, float]:
    """`metrics` with the personal models' scores of a runtime that keeps them."""
    score = self.task.evaluate_personal
    if self._personalized and score is not None:
      tables = self.runtime.get_personal_weights(state)
      metrics.update(
        score(
          {
            cid: tuple(t[i] for t in tables)
            for i, cid in enumerate(self.task.train_data.client_ids)
          }
        )
      )
    return metrics

  def __call__(self, state) -> dict[str, float]:
    return self.personal(state, self.task.evaluate(*self.model(state)))


def evaluator(
  task: task_lib.Task, runtime: runtime_base.Runtime, *, regularizer=None, algorithm: str = ''
) -> Evaluation:
  """The `Evaluation` of `runtime`'s states by `task`, with the run's `regularizer`
  (None: the task's); `algorithm` names the algorithm in the error.

  Raises:
    ConfigError: the runtime has personal models and the task cannot score them.
  """
  if runtime.keeps_personal_models and task.evaluate_personal is None:
    raise ConfigError(
      f'algorithm {algorithm!r} trains a personal model per client;'
      f' task {task.name!r} cannot evaluate them (its evaluation clients are not its'
      ' training clients). Try --task=dominant_class.'
    )
  return Evaluation(task, runtime, task.regularizer if regularizer is None else regularizer)


def evaluate_together(
  requests: Sequence[tuple[Callable[[Any], dict[str, float]], Any]],
) -> list[dict[str, float] | Exception]:
  """Each (evaluate, state)'s `evaluate(state)`, those `Evaluation`s whose task scores
  several models at once (`Task.evaluate_many`) together, each task's once: the same
  metrics, the data read once (a grid's batched trials, `tff_comp.trials`). An
  evaluation that fails gives its error in its place."""
  results: list[Any] = [None] * len(requests)
  # id(task.evaluate_many) -> (it, [(request, its Evaluation)])
  together: dict[int, tuple[Callable, list[tuple[int, Evaluation]]]] = {}
  for i, (evaluate, _) in enumerate(requests):
    if isinstance(evaluate, Evaluation) and (many := evaluate.task.evaluate_many) is not None:
      together.setdefault(id(many), (many, []))[1].append((i, evaluate))
    else:
      results[i] = _alone(*requests[i])
  for many, members in together.values():
    try:
      scored = many([e.model(requests[i][1]) for i, e in members])
    except Exception:  # each scored alone names its own
      scored = None
    for k, (i, e) in enumerate(members):
      results[i] = (
        _alone(*requests[i])
        if scored is None
        else _guarded(functools.partial(e.personal, requests[i][1], scored[k]))
      )
  return results


def _alone(evaluate: Callable[[Any], dict[str, float]], state) -> Any:
  return _guarded(lambda: evaluate(state))


def _guarded(fn: Callable[[], Any]) -> Any:
  try:
    return fn()
  except Exception as error:  # the caller's to raise
    return error


def client_evaluator(
  task: task_lib.Task, runtime: runtime_base.Runtime
) -> Callable[[Any], list[dict]] | None:
  """state -> the task's per-client evaluation rows of the global model (with each
  client's own model's `personal_*` scores for a runtime with personal models), or None
  for a task without per-client evaluation data."""
  score = task.evaluate_clients
  if score is None:
    return None
  personal = task.evaluate_personal_clients if runtime.keeps_personal_models else None
  client_ids = task.train_data.client_ids

  def evaluate_clients(state) -> list[dict]:
    rows = score(tuple(runtime.get_model_weights(state).trainable))
    if personal is not None:
      tables = runtime.get_personal_weights(state)
      own = {
        row['client']: row
        for row in personal({cid: tuple(t[i] for t in tables) for i, cid in enumerate(client_ids)})
      }
      rows = [dict(row, **own.get(row['client'], {})) for row in rows]
    return rows

  return evaluate_clients
