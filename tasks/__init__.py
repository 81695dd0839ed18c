"""Registered tasks: data, model, objective and metrics for an experiment."""

from tasks import lasso
from tasks import constrained_digits
from tasks import dominant_class
from tasks import imbalanced_digits
from tasks import nuclear
from tasks import quadratic
from tasks import sinewave
from tasks import sparse_logreg
from tasks import synthetic
from tasks.base import Task

__all__ = ['Task', 'constrained_digits', 'dominant_class', 'imbalanced_digits', 'lasso', 'nuclear', 'quadratic',
           'sinewave', 'sparse_logreg', 'synthetic']
