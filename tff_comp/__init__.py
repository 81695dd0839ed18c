"""tff_comp: federated composite, compositional and personalized optimization on TFF.

Two layers:
  math (pure TF, no TFF; `tff_comp.ops`): client rules and server rules by family
    (`sgd`, `composite`, `compositional`, `maml`, `per_client`, `scaffold`), one client's
    round (`client_round.run_client`), aggregation (`aggregation`), messages, and the
    `algorithm.Algorithm` every runtime runs, and the regularizers psi (`ops.regularizers`,
    also `tc.regularizers`).
  TFF (placement, `tff_comp.learning_process`): `client_work.build_local_client_work`,
    `aggregation_factories`, `server_update.build_server_update`, `composer.compose` ->
    a LearningProcess.
Algorithms: `registry.get_algorithm(name).build(model, ...)` (an Algorithm) or
`tff_comp.algorithms.<module>.build_<algo>` (its TFF process).
Runtimes (`tff_comp.runtime`, `runtime.base.Runtime`): TFF's ('tff'), the in-process
one ('inprocess') and Ray's ('ray'), registered by name; `runner_for(program,
client_data)` picks one.
Importing tff_comp imports no TensorFlow; once TFF is imported (before or after), TFF's
own default context is swapped for the same local C++ runtime with a worker that dies
with this process (`runtime.local_worker`): TFF's own worker outlives a script and
hangs the pipes it wrote to. A context set by anyone else stays.
Plugins: `registry.register_algorithm` / `register_task` / `register_runtime`.

The names below are re-exported, so composing an algorithm by hand needs this package
and the rule family it uses:

    import tff_comp as tc
    from tff_comp.ops import composite
    algorithm = tc.Algorithm(model, composite.DualAveraging(...), ..., tc.ClientOptions(10))
    process = tc.compose(algorithm)              # a tff.learning LearningProcess
    runtime, why = tc.runner_for(algorithm, client_data)
"""

import importlib

# wrapt (a TensorFlow dependency) for its post-import hook: the standard library has none.
import wrapt

from tff_comp import native_logs

# TensorFlow's C++ start-up notices kept out of the session (`native_logs`).
native_logs.install()


def _bind_tff_worker(tff_module) -> None:
  """Runs once TFF is imported: its default context becomes one whose worker dies with
  this process (`runtime.local_worker.adopt_default_context`)."""
  del tff_module
  from tff_comp.runtime import local_worker  # noqa: PLC0415  (TFF is loaded by now)

  local_worker.adopt_default_context()


wrapt.register_post_import_hook(_bind_tff_worker, 'tensorflow_federated')

# Submodules load on first use, so the math layer (`tff_comp.ops`) imports without TFF.
_SUBMODULES = (
  'learning_process',
  'models',
  'registry',
  'run',
  'runtime',
  'ops',
  'algorithms',
  'experiment',
  'trials',
)
# Short names of submodules elsewhere.
_ALIASES = {'regularizers': 'tff_comp.ops.regularizers'}
# The public surface: name -> the module defining it.
_EXPORTS = {
  'Algorithm': 'tff_comp.ops.algorithm',
  'ClientOptions': 'tff_comp.ops.client_round',
  'ClientRule': 'tff_comp.ops.rule',
  'ServerRule': 'tff_comp.ops.rule',
  'RuleWrapper': 'tff_comp.ops.rule',
  'trainable_specs': 'tff_comp.ops.model_ops',
  'server_sgd': 'tff_comp.algorithms.common',
  'process_builder': 'tff_comp.algorithms.common',
  'compose': 'tff_comp.learning_process.composer',
  'runner_for': 'tff_comp.runtime.choice',
  'Runtime': 'tff_comp.runtime.base',
  'get_algorithm': 'tff_comp.registry',
  'get_task': 'tff_comp.registry',
  'get_runtime': 'tff_comp.registry',
  'register_algorithm': 'tff_comp.registry',
  'register_task': 'tff_comp.registry',
  'register_runtime': 'tff_comp.registry',
  'Trial': 'tff_comp.trials',
  'run_trials': 'tff_comp.trials',
}


def __getattr__(name: str):
  """A lazy name, loaded on first use and kept in the module (so tools reading the
  module's namespace, pdoc among them, find it after)."""
  if name in _SUBMODULES:
    value = importlib.import_module(f'tff_comp.{name}')
  elif name in _ALIASES:
    value = importlib.import_module(_ALIASES[name])
  elif name in _EXPORTS:
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
  else:
    raise AttributeError(f'module tff_comp has no attribute {name!r}')
  globals()[name] = value
  return value


__all__ = [*_SUBMODULES, *_ALIASES, *_EXPORTS]  # noqa: PLE0604 (names of strings)


def __dir__() -> list[str]:
  return sorted(__all__)
