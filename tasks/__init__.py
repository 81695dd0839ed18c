"""Registered tasks: data, model, objective and metrics for an experiment."""

from tff_comp.tasks import lasso
from tff_comp.tasks import cifar100
from tff_comp.tasks import constrained_digits
from tff_comp.tasks import dominant_class
from tff_comp.tasks import emnist
from tff_comp.tasks import imbalanced_digits
from tff_comp.tasks import nuclear
from tff_comp.tasks import quadratic
from tff_comp.tasks import shakespeare
from tff_comp.tasks import sinewave
from tff_comp.tasks import sparse_logreg
from tff_comp.tasks import stackoverflow
from tff_comp.tasks import stackoverflow_tag
from tff_comp.tasks import synthetic
from tff_comp.tasks.base import Task

__all__ = ['Task', 'cifar100', 'constrained_digits', 'dominant_class', 'emnist', 'imbalanced_digits', 'lasso', 'nuclear', 'quadratic', 'shakespeare',
           'sinewave', 'sparse_logreg', 'stackoverflow', 'stackoverflow_tag', 'synthetic']
