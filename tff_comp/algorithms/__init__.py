"""Registered algorithms: each module is a short composition of math blocks.

Each module's registered builder returns the runtime-free `ops.algorithm.Algorithm`;
its `build_<algo>` returns the same algorithm as a genuine TFF LearningProcess
(`common.process_builder`). Every builder takes `model_aggregator` (any
`tff.aggregators` factory for the model delta; side channels are aggregated exactly,
`tff_comp.learning_process.aggregation_factories`), and those whose server runs an optimizer take
`server_optimizer`, as TFF's builders do. Registration names each algorithm's home task
(`registry.Entry`). Every module of this package is imported (so registered) here: a
new algorithm is one new module.
"""

import importlib
import pkgutil

for _module in pkgutil.iter_modules(__path__):
  importlib.import_module(f'{__name__}.{_module.name}')
