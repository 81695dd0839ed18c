r"""Reproduces a paper's comparison: each algorithm over its own grid, table and plot.

    python binaries/reproduce.py --experiment=fco_lasso       [--rounds=500]
    python binaries/reproduce.py --experiment=fco_nuclear
    python binaries/reproduce.py --experiment=fednova_synthetic
    python binaries/reproduce.py --experiment=drfl_imbalanced
    python binaries/reproduce.py --experiment=drfl_imbalanced_classes
    python binaries/reproduce.py --experiment=maml_sinewave
    python binaries/reproduce.py --experiment=scgdm_sinewave
    python binaries/reproduce.py --experiment=damaml_dominant_class

Every built-in experiment runs 3 seeds (`--seeds=1` for a quicker check).

For each algorithm and each configuration of its grid (the learning rates and its own
hyperparameters, a grid of the same size for every algorithm), trains one run per seed
(metrics in --output_dir/<experiment>/<algorithm>/lr_<c>_<s>[_<name>_<value>...]/), then
writes `results.md` (each algorithm at the configuration selected on validation data,
its reported metrics at the checkpoint rounds, and every configuration's score) and
`<experiment>.png`, .pdf and .svg (the plotted metrics against rounds at the selected
configurations; `binaries/figures.py`, as `compare.py`'s).
The grids are data
(`binaries/reproductions.py`, `registry.register_reproduction` for a plugin's own); the grid
runner is `binaries/grid.py`, the tables `binaries/summary.py`.
"""

import os

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')

import sys

from tff_comp.binaries import flag_check

# A bad flag is reported before TensorFlow loads (when an earlier start recorded the
# flags; `flag_check`).
flag_check.check(sys.argv, flag_check.program())

import dataclasses
import datetime
import math
import pathlib
import time

from absl import app, flags

from tff_comp import experiment as experiment_lib
from tff_comp import registry, signals
from tff_comp import trials as trials_lib
from tff_comp.binaries import closed_stdout, flags_lib, grid, grid_processes, reproductions, summary
from tff_comp.config import experiment_config, run_directory
from tff_comp.runtime import base as runtime_base
from tff_comp.runtime import inprocess
from tff_comp.runtime.ray import cluster as ray_cluster

_EXPERIMENT = flags.DEFINE_enum(
  'experiment',
  'fco_lasso',
  registry.REPRODUCTIONS.names(),
  'Which comparison (built-in: binaries/reproductions.py; plugins register their own).',
)
_ROUNDS = flags.DEFINE_integer('rounds', None, "Override the experiment's rounds.", lower_bound=1)
_SEED = flags.DEFINE_integer(
  'seed', 0, 'Run seed (client sampling) of experiments without their own seeds.'
)
_DATA_SEED = flags.DEFINE_integer(
  'data_seed',
  None,
  "Seed of the task data for every run (default: each run's seed,"
  ' as for the committed results: each seed draws its own data and sampling).',
)
_OUTPUT = flags.DEFINE_string(
  'output_dir', 'runs/reproduce', 'Where results go (the committed ones are in results/).'
)
_OVERWRITE = flags.DEFINE_bool('overwrite', False, 'Replace runs already in --output_dir.')
_RESUME = flags.DEFINE_bool(
  'resume',
  False,
  'Continue an interrupted grid: finished configurations are read'
  ' back, an interrupted one continues from its last checkpoint.',
)
_CHECKPOINT_EVERY = flags.DEFINE_integer(
  'checkpoint_every', 100, 'Rounds between saved states of each run (for --resume).'
)
# Processes a grid may run at once: each holds its own TensorFlow (hundreds of MB), and
# more than a few per core only contend for the cores.
_PROCESSES_PER_CORE = 4
_MOST_PARALLEL = _PROCESSES_PER_CORE * (os.cpu_count() or 1)
_PARALLEL = flags.DEFINE_integer(
  'parallel',
  None,
  "Run the grid's units (algorithms with --batch_trials, else (algorithm, seed) groups)"
  f' in this many processes (at most {_MOST_PARALLEL}: {_PROCESSES_PER_CORE} per core of'
  ' this machine). Default: one a core, at most one a unit, as many as the memory holds'
  ' (said in one line).',
  lower_bound=1,
  upper_bound=_MOST_PARALLEL,
)
_BATCH_TRIALS = flags.DEFINE_bool(
  'batch_trials',
  True,
  "Run each algorithm's configurations and seeds as batched"
  ' trials: those sharing a build in one compiled program (tff_comp.trials), each'
  ' writing and equal to its own run; --nobatch_trials: one run after another.',
)
_RAY_ADDRESS = flags.DEFINE_string(
  'ray_address',
  '',
  "Run the grid's units (each algorithm's batched trials, or each"
  ' (algorithm, seed) group) as Ray tasks on this cluster: local, auto or host:port'
  ' (BUILD_NOTES.md); a unit lost with its worker runs again, resumed. Default: no'
  ' Ray (--parallel processes of this machine).',
)
_BATCH_MEMORY_BUDGET = flags.DEFINE_float(
  'batch_memory_budget',
  trials_lib.DEFAULT_MEMORY_BUDGET,
  "MB a batched program's trials may take together (their states and cohorts); a"
  ' larger group runs in several programs, said in one line.',
  lower_bound=1.0,
)
flags.register_validator(
  'batch_memory_budget',
  math.isfinite,  # NaN passes absl's lower bound
  '--batch_memory_budget must be a finite number of MB.',
)
_RUNTIME = flags.DEFINE_enum(
  'runtime', 'auto', experiment_config.runtime_names(), 'Where rounds run (see run.py --helpfull).'
)
_ENGINE = flags.DEFINE_enum(
  'engine',
  'auto',
  list(inprocess.ENGINES),
  "The in-process runtime's engine (see run.py --helpfull).",
)
_ALGORITHMS = flags.DEFINE_list(
  'algorithms',
  None,
  "Train only these of the experiment's algorithms (default: all);"
  ' the table then covers them only: --summarize_only rebuilds it from all saved runs.',
)
_CLIENT_LRS = flags.DEFINE_list(
  'client_learning_rates', None, "Override the grid's client learning rates (e.g. 0.001,0.003)."
)
_SERVER_LRS = flags.DEFINE_list(
  'server_learning_rates', None, "Override the grid's server learning rates."
)
_SEEDS = flags.DEFINE_integer(
  'seeds', None, "Run only the first N of the experiment's seeds (a quicker check).", lower_bound=1
)
_EVAL_PERIOD = flags.DEFINE_integer(
  'eval_period', None, "Override the experiment's evaluation period.", lower_bound=1
)
_SUMMARIZE_ONLY = flags.DEFINE_bool(
  'summarize_only', False, 'Rebuild results.md and the plot from runs already saved.'
)


def _steered(spec: reproductions.Reproduction) -> reproductions.Reproduction:
  """`spec` with the grid and evaluation period the command line overrides."""
  changes = {}
  for flag, field in (
    (_CLIENT_LRS, 'client_learning_rates'),
    (_SERVER_LRS, 'server_learning_rates'),
  ):
    if flag.value:
      try:
        changes[field] = tuple(float(v) for v in flag.value)
      except ValueError as e:
        raise ValueError(f'--{field}: {",".join(flag.value)} is not a list of numbers.') from e
      if not all(math.isfinite(v) and v > 0 for v in changes[field]):
        raise ValueError(f'--{field} must be positive finite numbers.')
      # The command line's rates replace every algorithm's own rate axis too.
      axis = field[:-1]
      changes['tuning'] = {
        a: {k: v for k, v in own.items() if k != axis}
        for a, own in changes.get('tuning', spec.tuning).items()
      }
  if _EVAL_PERIOD.value:
    changes['eval_period'] = _EVAL_PERIOD.value
  return dataclasses.replace(spec, **changes)


@closed_stdout.closing_stdout_quietly
def main(argv):
  """Ctrl-C or SIGTERM stop the running configuration at the end of its round
  (`tff_comp.signals`)."""
  with signals.stop_at_round_end():
    _reproduce(argv)


def _reproduce(argv):
  if len(argv) > 1:
    flags_lib.fail(f'unexpected arguments: {" ".join(argv[1:])}')
  flags_lib.quiet_logs()
  name = _EXPERIMENT.value
  try:
    spec = _steered(registry.REPRODUCTIONS.get(name).build())
  except ValueError as e:
    flags_lib.fail(str(e))
  if _RAY_ADDRESS.value and (_PARALLEL.value or 1) > 1:
    flags_lib.fail("--parallel and --ray_address both choose where the grid's units run: give one.")
  if _RAY_ADDRESS.value and not _SUMMARIZE_ONLY.value:
    try:  # joined before the grid's directory is made: a cluster not there writes nothing
      ray_cluster.connect(_RAY_ADDRESS.value)
    except runtime_base.UnsupportedError as e:
      flags_lib.fail(str(e))
  rounds = spec.rounds if _ROUNDS.value is None else _ROUNDS.value
  root = pathlib.Path(_OUTPUT.value) / name
  seeds = spec.seeds or (_SEED.value,)
  if _SEEDS.value:
    seeds = seeds[: _SEEDS.value]
  if _ALGORITHMS.value:
    unknown = sorted(set(_ALGORITHMS.value) - set(spec.algorithms))
    if unknown:
      flags_lib.fail(f'--algorithms: {unknown} not in {name}: {spec.algorithms}')
    spec = dataclasses.replace(
      spec, algorithms=tuple(a for a in spec.algorithms if a in _ALGORITHMS.value)
    )
  if _SUMMARIZE_ONLY.value:
    try:
      curves = grid.read_grid(spec, seeds, root)
    except FileNotFoundError as e:
      flags_lib.fail(f'--summarize_only: {e}')
  if not (_SUMMARIZE_ONLY.value or _OVERWRITE.value or _RESUME.value):
    # Said before the grid starts (each run's own check refused the first it met, after
    # the grid's processes had started).
    runs = [path for a in spec.algorithms for path in grid.run_dirs(root, spec, a, seeds)]
    held = [path for path in runs if run_directory.run_files(path)]
    if held:
      flags_lib.fail(
        f'--output_dir={_OUTPUT.value} holds {len(held)} of the {len(runs)} runs of {name}'
        f' (the first: {held[0]}); pass --resume to read the finished ones back and run the'
        ' rest, --overwrite to run them anew, or --summarize_only to rebuild the table from'
        ' them.'
      )
  root.mkdir(parents=True, exist_ok=True)
  # The command that ran, as it was given (flag values included).
  command = ' '.join(['python binaries/reproduce.py', *sys.argv[1:]])
  if _SUMMARIZE_ONLY.value:
    # The runs' own command and timing stay, from the results.md being rewritten.
    earlier = summary.earlier_record(root / 'results.md')
    provenance = f'Tables and plot rewritten by `{command}`.'
    if earlier:
      command, took = earlier
      provenance = f'{took} {provenance}'.strip()
  else:
    parallel = _PARALLEL.value or 1
    if _PARALLEL.value is None and not _RAY_ADDRESS.value:
      parallel, why = grid_processes.default_processes(spec, len(seeds), _BATCH_TRIALS.value)
      print(f'reproduce.py: {why} (--parallel sets it).', flush=True)
    start = time.monotonic()
    try:
      curves = grid.run_grid(
        name,
        spec,
        rounds,
        seeds,
        root,
        _RUNTIME.value,
        engine=_ENGINE.value,
        data_seed=_DATA_SEED.value,
        overwrite=_OVERWRITE.value,
        resume=_RESUME.value,
        checkpoint_every=_CHECKPOINT_EVERY.value,
        parallel=parallel,
        batch_trials=_BATCH_TRIALS.value,
        batch_memory_budget=_BATCH_MEMORY_BUDGET.value,
        ray_address=_RAY_ADDRESS.value,
      )
    except experiment_lib.ConfigError as e:
      flags_lib.fail(str(e))
    except KeyboardInterrupt as e:  # Ctrl-C or SIGTERM (tff_comp.signals)
      sigterm = 'SIGTERM' in getattr(e.__cause__, 'args', ())
      print(
        f'reproduce.py: {"terminated (SIGTERM)" if sigterm else "interrupted"}; the'
        ' running configuration saved its last finished round; rerun with --resume'
        ' to continue the grid.',
        file=sys.stderr,
      )
      sys.exit(143 if sigterm else 130)
    minutes, seconds = divmod(round(time.monotonic() - start), 60)
    provenance = (
      f'Took {minutes} min {seconds} s on {summary.machine()},'
      f' {datetime.date.today()} ('
      + (f'--ray_address={_RAY_ADDRESS.value}' if _RAY_ADDRESS.value else f'--parallel={parallel}')
      + f', --{"" if _BATCH_TRIALS.value else "no"}batch_trials'
      + (', --resume: the runs finished before were read back, untimed' if _RESUME.value else '')
      + ').'
    )
  print(summary.summarize(name, spec, curves, rounds, root, command, provenance))
  print(
    f'wrote {root / "results.md"} and {root / name}.png (.pdf, .svg); each run is under'
    f' {root}/<algorithm>/'
  )


if __name__ == '__main__':
  app.run(main, flags_parser=flags_lib.parse_or_fail)
