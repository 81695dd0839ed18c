"""Registered tasks: data, model, objective and metrics for an experiment."""

from tff_comp.tasks import (
  cifar100,
  constrained_digits,
  dominant_class,
  emnist,
  imbalanced_digits,
  lasso,
  nuclear,
  quadratic,
  shakespeare,
  sinewave,
  sorted_digits,
  sparse_logreg,
  stackoverflow,
  stackoverflow_tag,
  synthetic,
)
from tff_comp.tasks.base import Task

__all__ = [
  'Task',
  'cifar100',
  'constrained_digits',
  'dominant_class',
  'emnist',
  'imbalanced_digits',
  'lasso',
  'nuclear',
  'quadratic',
  'shakespeare',
  'sinewave',
  'sorted_digits',
  'sparse_logreg',
  'stackoverflow',
  'stackoverflow_tag',
  'synthetic',
]
