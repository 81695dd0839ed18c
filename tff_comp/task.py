"""The library's contract with tasks: what a registered task builder returns.

A task is an experiment's data, model, objective and metrics. The library reads a task
only through this protocol; `tff_comp.tasks.base.Task` (a frozen dataclass) is the
implementation the built-in tasks use, and a plugin's task may be any object with
these members (`registry.register_task`).
"""

from collections.abc import Callable, Mapping, Sequence
import dataclasses
from typing import Any, Protocol, cast, runtime_checkable

import numpy as np

from tff_comp.ops import regularizers

Metrics = dict[str, float]
Weights = tuple[np.ndarray, ...]  # a model's trainable weights, as NumPy arrays


@runtime_checkable
class Task(Protocol):
  """What the library uses of a task.

  Attributes:
    name: the registered name.
    model: the `tff.learning.models.FunctionalModel` to train.
    train_data: the clients' datasets of unbatched examples
      (`tff.simulation.datasets.ClientData`).
    regularizer: psi in the objective F(w) + psi(w) (`ops.regularizers`; NoRegularizer
      if none).
    regularizer_targets: indices of the trainable tensors a user-chosen regularizer may
      cover (usually the kernel).
    evaluate: (trainable weights, the run's psi) -> metrics, in Python outside TFF.
    defaults: default run settings (rounds, clients_per_round, client_learning_rate,
      server_learning_rate, batch_size, local_epochs, eval_period).
    reference: None, or () -> reference metrics (a centralized optimum), computed lazily.
    evaluate_personal: None, or for tasks whose evaluation clients are the training
      clients, ({client id: its personal model's trainable weights}) -> metrics.
    evaluate_clients: None, or (trainable weights) -> one row per client ({'client': id,
      metric: value, ...}).
    evaluate_personal_clients: None, or as `evaluate_personal`, one row per client.
    evaluate_many: None, or [(trainable weights, psi), ...] -> each one's `evaluate`
      metrics, equal to the bit, computed together (a grid's batched trials).
    num_clients: the number of training clients.
    weight_shapes: the shapes of the model's trainable weights.
  """

  name: str
  model: Any
  train_data: Any
  regularizer: regularizers.Regularizer
  regularizer_targets: tuple[int, ...]
  evaluate: Callable[[Weights, regularizers.Regularizer], Metrics]
  defaults: Mapping[str, Any]
  reference: Callable[[], Metrics] | None
  evaluate_personal: Callable[[Mapping[str, Weights]], Metrics] | None
  evaluate_clients: Callable[[Weights], list[dict[str, Any]]] | None
  evaluate_personal_clients: Callable[[Mapping[str, Weights]], list[dict[str, Any]]] | None
  evaluate_many: (
    Callable[[Sequence[tuple[Weights, regularizers.Regularizer]]], list[Metrics]] | None
  )

  @property
  def num_clients(self) -> int: ...

  @property
  def weight_shapes(self) -> list[tuple[int, ...]]: ...


def missing(task: Any) -> list[str]:
  """The members of `Task` that `task` lacks (none: it implements the contract)."""
  return [
    name
    for name in (*Task.__annotations__, 'num_clients', 'weight_shapes')
    if not hasattr(task, name)
  ]


def with_train_data(task: Task, train_data: Any) -> Task:
  """`task` training on other clients' datasets (poisoned, or several tasks' merged).

  Raises:
    ValueError: `task` is no dataclass (the protocol allows any object), so it cannot be
      copied with other data.
  """
  if isinstance(task, type) or not dataclasses.is_dataclass(task):
    raise ValueError(
      f'{type(task).__name__} is no dataclass task (tff_comp.tasks.base.Task), so it'
      ' cannot train on other clients.'
    )
  return cast(Task, dataclasses.replace(task, train_data=train_data))
