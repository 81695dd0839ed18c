"""Which runtime runs a program: the one named, or for 'auto' the first registered
runtime that can (each says why not by raising `base.UnsupportedError`)."""

from collections.abc import Sequence

from tff_comp import registry
from tff_comp.runtime import base
from tff_comp.runtime import workers as workers_lib
from tff_comp.settings import ConfigError

# 'auto': the first of these registered runtimes that can run the program (in-process
# for every registered algorithm with its own aggregation), else the next.
AUTO_RUNTIMES = ('inprocess', 'tff')
_SPOKEN = {'inprocess': 'in-process'}  # runtime names as the run's header says them


def runner_for(program, client_data, runtime: str = 'auto', workers: Sequence[str] = (),
               engine: str = 'auto', batch_size: int | None = None,
               client_rounds: int | None = None, data_memory_budget: float | None = None
               ) -> tuple[base.Runtime, str]:
  """(the runtime running `program` on `client_data`, one line saying which and why).

  `program` is an Algorithm or a LearningProcess. `runtime` names a registered runtime
  (`registry.RUNTIMES`: 'inprocess', 'tff', plugins) or 'auto': the first of
  `AUTO_RUNTIMES` that can run the program ('tff' when `workers` are named), the reason
  for passing over the others in the line. `workers` go to TFF's runtime, `engine` to
  the in-process one, `batch_size` to TFF's for a process taking batched datasets,
  `client_rounds` (the run's rounds x clients per round) to runtimes choosing an engine
  by the run's length, `data_memory_budget` (MB) to runtimes that stream a population
  larger than it.

  Raises:
    ConfigError: the named runtime cannot run the program; the rounds cannot be split
      across workers; a worker does not answer.
  """
  options = {'workers': tuple(workers), 'engine': engine, 'batch_size': batch_size,
             'client_rounds': client_rounds, 'data_memory_budget': data_memory_budget}
  names = AUTO_RUNTIMES if runtime == 'auto' else (runtime,)
  if workers:
    names = ('tff',)
  passed_over = []
  for name in names:
    entry = registry.get_runtime(name)
    try:
      built = entry.build(program, client_data,
                          **{k: v for k, v in options.items() if entry.accepts(k)})
    except base.UnsupportedError as e:
      if name == names[-1]:
        raise ConfigError(f'--runtime={name}: {e}') from e
      passed_over.append(f'not {_SPOKEN.get(name, name)}: {e}')
      continue
    except (workers_lib.NotMergeableError, workers_lib.WorkerError) as e:
      raise ConfigError(f'--workers: {e}') from e
    why = f' ({"; ".join(passed_over)})' if passed_over else ''
    return built, built.description + why
  raise AssertionError('unreachable: the last runtime returns or raises')
