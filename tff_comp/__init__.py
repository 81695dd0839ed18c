"""tff_comp: federated composite, compositional and personalized optimization on TFF.

Importing tff_comp makes TFF's default execution context a local C++ runtime whose
worker process dies with Python (see `tff_comp.runtime`).

Public surface:
  blocks     client_work.build_local_client_work, aggregators.dual_state_mean,
             server_updates.build_*_update, composer.compose_learning_process
  math       regularizers, ops.client_updates, ops.local_loop, ops.server_steps
  algorithms registry.get_algorithm(name).builder, or tff_comp.algorithms.<module>
  plugins    registry.register_algorithm / register_task and entry points
"""

from tff_comp import runtime as _runtime

_runtime.install_local_runtime()

# pylint: disable=g-import-not-at-top,wrong-import-position
from tff_comp import aggregators
from tff_comp import client_work
from tff_comp import composer
from tff_comp import regularizers
from tff_comp import registry
from tff_comp import server_updates
from tff_comp.registry import get_algorithm
from tff_comp.registry import get_task
from tff_comp.registry import register_algorithm
from tff_comp.registry import register_task

__all__ = [
    'aggregators',
    'client_work',
    'composer',
    'get_algorithm',
    'get_task',
    'register_algorithm',
    'register_task',
    'regularizers',
    'registry',
    'server_updates',
]
