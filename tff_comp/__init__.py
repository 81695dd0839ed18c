"""tff_comp: federated composite, compositional and personalized optimization on TFF.

Two layers:
  math (pure TF, no TFF; `tff_comp.ops`): client rules and server rules by family
    (`sgd`, `composite`, `compositional`, `maml`, `per_client`), one client's round
    (`client_round.run_client`), aggregation (`aggregation`), messages, and the
    `algorithm.Algorithm` record any runtime runs; regularizers (`tff_comp.regularizers`).
  TFF (placement): `client_work.build_local_client_work`, `aggregators`,
    `server_update.build_server_update`, `composer.compose` -> a LearningProcess.
Algorithms: `registry.get_algorithm(name).builder`, or `tff_comp.algorithms.<module>`.
Runtimes (`tff_comp.runtime`): TFF's, with a local worker that dies with Python
(`runtime.install_local_runtime`), and the in-process one (`runtime.inprocess`).
Importing tff_comp changes no TFF context: the code that runs things chooses one.
Plugins: `registry.register_algorithm` / `register_task` and entry points.
"""

import importlib

# Submodules load on first use, so the math layer (`tff_comp.ops`) imports without TFF.
_SUBMODULES = ('aggregators', 'client_work', 'composer', 'regularizers', 'registry',
               'server_update', 'runtime', 'ops', 'algorithms', 'experiment')
_REGISTRY_NAMES = ('get_algorithm', 'get_task', 'register_algorithm', 'register_task')


def __getattr__(name: str):
  if name in _SUBMODULES:
    return importlib.import_module(f'tff_comp.{name}')
  if name in _REGISTRY_NAMES:
    return getattr(importlib.import_module('tff_comp.registry'), name)
  raise AttributeError(f'module tff_comp has no attribute {name!r}')


__all__ = [*_SUBMODULES, *_REGISTRY_NAMES]
