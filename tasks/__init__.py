"""Registered tasks: data, model, objective and metrics for an experiment."""

from tasks import lasso
from tasks import nuclear
from tasks.base import Task

__all__ = ['Task', 'lasso', 'nuclear']
