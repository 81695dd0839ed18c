"""The grid runner of the reproductions: every (algorithm, configuration, seed) of an
`reproductions.Reproduction`, trained through the library's run path (`experiment.prepare`,
`build_runner` once per algorithm, seed and build option, `train` per configuration; or
all of an algorithm's configurations and seeds as batched trials, `tff_comp.trials`),
and the curves read back from each run's metrics.csv."""

import collections
from collections.abc import Sequence
import pathlib
import time
from typing import Any

from tff_comp import experiment as experiment_lib
from tff_comp import registry
from tff_comp import trials as trials_lib
from tff_comp.binaries import curves as curves_lib
from tff_comp.binaries import grid_processes, grid_progress, reproductions
from tff_comp.run import callbacks


def plotted(spec: reproductions.Reproduction) -> tuple[str, ...]:
  return spec.plot_metrics or (spec.metric,)


def recorded(spec: reproductions.Reproduction) -> tuple[str, ...]:
  """The metrics read back from each run: those plotted, reported and selected on."""
  return tuple(
    dict.fromkeys(
      plotted(spec)
      + (spec.metric, reproductions.selection(spec)[0])
      + ((spec.x_axis,) if spec.x_axis else ())
    )
  )


def run_dir(root, algorithm, config, seed, seeds, names=()) -> pathlib.Path:
  """Where one run of the grid writes: `lr_<eta_c>_<eta_s>`, then `_<name>_<value>` for
  each of the algorithm's own axes (`names`, after the learning rates), then the seed."""
  lr_c, lr_s, *own = config
  out = (
    root
    / algorithm
    / (
      f'lr_{lr_c:g}_{lr_s:g}' + ''.join(f'_{name}_{value:g}' for name, value in zip(names[2:], own))
    )
  )
  return out / f'seed_{seed}' if len(seeds) > 1 else out


def run_dirs(
  root: pathlib.Path,
  spec: reproductions.Reproduction,
  algorithm: str,
  seeds: Sequence[int],
  only: Sequence[int] | None = None,
) -> list[pathlib.Path]:
  """The run directories of `algorithm` in the grid (`run_dir`), seed by seed: of every
  seed in `seeds`, or of those `only` lists."""
  names = list(reproductions.axes(spec, algorithm))
  return [
    run_dir(root, algorithm, config, s, seeds, names)
    for s in (seeds if only is None else only)
    for config in reproductions.configurations(spec, algorithm)
  ]


def _config(
  spec: reproductions.Reproduction,
  algorithm: str,
  seed: int,
  rounds: int,
  root: pathlib.Path,
  options: dict,
  algorithm_options: dict,
  **run: Any,
) -> experiment_lib.ExperimentConfig:
  # output_dir (unless `run` gives one): the algorithm's folder of per-configuration
  # runs, so preparing never looks at run.py's default runs/<algo>-<task> (a `make run`
  # there must not stop a grid).
  return experiment_lib.ExperimentConfig.of(
    **{
      'output_dir': str(root / algorithm),
      **run,
      'algorithm': spec.aliases.get(algorithm, algorithm),
      'task': spec.task,
      'rounds': rounds,
      'seed': seed,
      'eval_period': spec.eval_period,
      'task_options': dict(spec.task_options),
      'algorithm_options': {**spec.algorithm_options.get(algorithm, {}), **algorithm_options},
      **options,
      **spec.settings,
      **spec.algorithm_settings.get(algorithm, {}),
    }
  )


def _rule_hparams(prepared: experiment_lib.Prepared) -> set[str]:
  """The hparams of the run's client rule (none for a plugin's TFF process): what a grid
  sets without building again (`_split`)."""
  program = prepared.build()
  return set(program.client_rule.initial_hparams()) if hasattr(program, 'client_rule') else set()


def _split(values: dict[str, float], hparams: set[str]) -> tuple[dict, dict]:
  """A configuration's (client rule hparams, build options): the learning rates and the
  rule's own hyperparameters are set through the hparams; other options need a build."""
  own = {k: v for k, v in values.items() if k not in reproductions.LEARNING_RATES}
  return (
    {k: v for k, v in own.items() if k in hparams},
    {k: v for k, v in own.items() if k not in hparams},
  )


def _outcome(spec: reproductions.Reproduction, curve: dict, rounds: int) -> str:
  final = curve[spec.metric]
  last = max(final)
  return (
    f'{spec.metric}={final[last]:.4g} at round {last}'
    if last >= rounds
    else f'diverged at round {diverged_at(curve)}'
  )


def _run_batched(
  name: str,
  spec: reproductions.Reproduction,
  algorithm: str,
  rounds: int,
  seeds,
  root: pathlib.Path,
  options: dict,
  memory_budget: float = trials_lib.DEFAULT_MEMORY_BUDGET,
) -> list[dict]:
  """Trains one algorithm over its grid and seeds as batched trials (`tff_comp.trials`:
  those sharing a build run as one program). Returns per seed {configuration: {metric:
  curve}}."""
  names, metrics = list(reproductions.axes(spec, algorithm)), recorded(spec)
  hparams = _rule_hparams(
    experiment_lib.prepare(_config(spec, algorithm, seeds[0], rounds, root, options, {}))
  )
  accepts_server_rate = registry.get_algorithm(spec.aliases.get(algorithm, algorithm)).accepts(
    'server_learning_rate'
  )
  entries = []
  for seed in seeds:
    for config in reproductions.configurations(spec, algorithm):
      values = dict(zip(names, config))
      client_hparams, build_options = _split(values, hparams)
      out = run_dir(root, algorithm, config, seed, seeds, names)
      rates = dict(client_learning_rate=config[0], server_learning_rate=config[1])
      if not accepts_server_rate:  # q-FedAvg's ratio step: its grid's server rate is 1
        del rates['server_learning_rate']
      entries.append(
        (
          seed,
          config,
          out,
          trials_lib.Trial(
            _config(
              spec,
              algorithm,
              seed,
              rounds,
              root,
              options,
              build_options,
              output_dir=str(out),
              **rates,
            ),
            client_hparams,
            extra_config={
              'experiment': name,
              'grid_algorithm': algorithm,
              'client_learning_rate': config[0],
              'server_learning_rate': config[1],
              'grid_configuration': values,
            },
          ),
        )
      )
  start = time.monotonic()
  results = trials_lib.run_trials(
    [entry[3] for entry in entries],
    say=lambda line: print(line, flush=True),
    memory_budget=memory_budget,
  )
  took = time.monotonic() - start
  curves: list[dict] = [{} for _ in seeds]
  for (seed, config, out, _), result in zip(entries, results):
    label = reproductions.describe(spec, algorithm, config)
    if isinstance(result, callbacks.DivergenceError):
      print(f'{algorithm} {label} seed {seed}: {result}')
    elif isinstance(result, Exception):
      raise result
    curve = curves_lib.read_curves(out, metrics, spec.metric_sources.get(algorithm, {}))
    curves[list(seeds).index(seed)][config] = curve
    print(
      f'{algorithm:15s} {label} seed={seed} {_outcome(spec, curve, rounds)}'
      f' ({took:.0f}s for the {len(entries)} runs trained together)',
      flush=True,
    )
  return curves


def _run_group(
  name: str,
  spec: reproductions.Reproduction,
  algorithm: str,
  seed: int,
  rounds: int,
  seeds,
  root: pathlib.Path,
  options: dict,
) -> dict:
  """Trains one algorithm with one seed over its grid. The learning rates and the client
  work's own hparams are set through the hparams of one build; other tuned options get
  a build per value. Returns {configuration: {metric: curve}}."""
  names = list(reproductions.axes(spec, algorithm))
  metrics = recorded(spec)
  base = experiment_lib.prepare(_config(spec, algorithm, seed, rounds, root, options, {}))
  hparams = _rule_hparams(base)
  configs = reproductions.configurations(spec, algorithm)
  splits = {config: _split(dict(zip(names, config)), hparams) for config in configs}
  # The engine 'auto' takes counts the rounds of every run a build serves.
  sharing = collections.Counter(tuple(sorted(b.items())) for _, b in splits.values())
  built, curves = {}, {}
  for config in configs:
    values = dict(zip(names, config))
    client_hparams, build_options = splits[config]
    key = tuple(sorted(build_options.items()))
    if key not in built:
      prepared = (
        experiment_lib.prepare(_config(spec, algorithm, seed, rounds, root, options, build_options))
        if key
        else base
      )
      built[key] = prepared, experiment_lib.build_runner(prepared, sharing[key])
    prepared, runner = built[key]
    out = run_dir(root, algorithm, config, seed, seeds, names)
    start = time.monotonic()
    label = reproductions.describe(spec, algorithm, config)
    try:
      experiment_lib.train_runner(
        prepared,
        runner,
        show_progress=False,
        learning_rates=config[:2],
        callbacks=experiment_lib.default_callbacks(prepared, runner, show_progress=False),
        client_hparams=client_hparams,
        output_dir=str(out),
        extra_config={
          'experiment': name,
          'grid_algorithm': algorithm,
          'client_learning_rate': config[0],
          'server_learning_rate': config[1],
          'grid_configuration': values,
        },
      )
    except callbacks.DivergenceError as e:
      print(f'{algorithm} {label} seed {seed}: {e}')
    curves[config] = curves_lib.read_curves(out, metrics, spec.metric_sources.get(algorithm, {}))
    print(
      f'{algorithm:15s} {label} seed={seed} {_outcome(spec, curves[config], rounds)}'
      f' ({time.monotonic() - start:.0f}s)',
      flush=True,
    )
  return curves


def check_grid(
  spec: reproductions.Reproduction, seeds, rounds: int, root: pathlib.Path, options: dict
) -> None:
  """Prepares every algorithm of the grid with each of its configurations' own values
  (one task built, shared), so that a setting the settings refuse stops the grid before
  any unit starts: in processes, every other unit ran to its end before a unit's error
  surfaced, and no table was written.

  Raises:
    ConfigError: the first configuration refused, in one line.
  """
  first = None
  for algorithm in spec.algorithms:
    names = list(reproductions.axes(spec, algorithm))
    owns = dict.fromkeys(
      tuple(sorted(_split(dict(zip(names, config)), set())[1].items()))
      for config in reproductions.configurations(spec, algorithm)
    )
    for own in owns:
      config = _config(spec, algorithm, seeds[0], rounds, root, options, dict(own))
      prepared = experiment_lib.prepare(config, like=first)
      first = first or prepared


def run_grid(
  name: str,
  spec: reproductions.Reproduction,
  rounds: int,
  seeds,
  root: pathlib.Path,
  runtime: str = 'auto',
  *,
  engine: str = 'auto',
  data_seed: int | None = None,
  overwrite: bool = False,
  resume: bool = False,
  checkpoint_every: int = 100,
  parallel: int = 1,
  batch_trials: bool = True,
  batch_memory_budget: float = trials_lib.DEFAULT_MEMORY_BUDGET,
  ray_address: str = '',
  progress_every: float = 30.0,
):
  """Trains every (algorithm, configuration, seed); `data_seed` None: each run's data
  seed is its seed. `resume`: finished configurations are read back, an interrupted one
  continues from its checkpoint. `batch_trials`: each algorithm's configurations and
  seeds run as batched trials (`tff_comp.trials`, within `batch_memory_budget` MB a
  program), else one after another per (algorithm, seed). `parallel` > 1: those units
  (algorithms, or (algorithm, seed) groups) run in that many processes; `ray_address`:
  as Ray tasks on that cluster (`ray_cluster.run_tasks`; a unit lost with its worker
  runs again, resuming its runs from their checkpoints). Every `progress_every` seconds
  one line says each unit's rounds so far (`grid_progress`).

  Returns {algorithm: {configuration: [{metric: curve} per seed]}}, a configuration
  being the values of `reproductions.axes` in order: (eta_c, eta_s, own values...).
  """
  options = dict(
    data_seed=data_seed,
    overwrite=overwrite,
    resume=resume,
    checkpoint_every=checkpoint_every,
    runtime=runtime,
    engine=engine,
  )
  check_grid(spec, seeds, rounds, root, options)
  if batch_trials:
    units = [(a, None) for a in spec.algorithms]
    run, args = (
      _run_batched,
      [(name, spec, a, rounds, seeds, root, options, batch_memory_budget) for a in spec.algorithms],
    )
  else:
    units = [(a, seed) for a in spec.algorithms for seed in seeds]
    run, args = (
      _run_group,
      [(name, spec, a, seed, rounds, seeds, root, options) for a, seed in units],
    )
  labels = [a if seed is None else f'{a}, seed {seed}' for a, seed in units]
  unit_runs = [
    run_dirs(root, spec, a, seeds, None if seed is None else [seed]) for a, seed in units
  ]
  with grid_progress.GridProgress(
    labels, unit_runs, rounds, every=progress_every, replacing=overwrite
  ) as progress:
    results = grid_processes.run_units(run, args, labels, options, parallel, ray_address, progress)
  curves: dict[str, dict[tuple[float, ...], list]] = {
    a: {config: [] for config in reproductions.configurations(spec, a)} for a in spec.algorithms
  }
  for (algorithm, seed), result in zip(units, results):
    for per_seed in result if seed is None else [result]:
      for config, curve in per_seed.items():
        curves[algorithm][config].append(curve)
  return curves


def diverged_at(run) -> int:
  """The round a stopped run diverged in: the loop writes no row for it, so the one
  after its last row (`curves_lib.read_curves`'s 'round')."""
  return max(max(curve, default=0) for curve in run.values()) + 1


def read_grid(spec: reproductions.Reproduction, seeds, root: pathlib.Path):
  """The curves of a grid's saved runs (as `run_grid` returns them), without training.
  Raises FileNotFoundError naming how many runs have no metrics.csv, and the first."""
  runs = {
    a: {
      config: [
        run_dir(root, a, config, seed, seeds, list(reproductions.axes(spec, a))) for seed in seeds
      ]
      for config in reproductions.configurations(spec, a)
    }
    for a in spec.algorithms
  }
  missing = [
    path / 'metrics.csv'
    for by_config in runs.values()
    for paths in by_config.values()
    for path in paths
    if not (path / 'metrics.csv').exists()
  ]
  if missing:
    raise FileNotFoundError(
      f"{len(missing)} of the grid's runs have no metrics.csv under {root} (the first:"
      f' {missing[0]}); run the grid there first, or give the --output_dir it wrote to.'
    )
  metrics = recorded(spec)
  return {
    a: {
      config: [
        curves_lib.read_curves(path, metrics, spec.metric_sources.get(a, {})) for path in paths
      ]
      for config, paths in by_config.items()
    }
    for a, by_config in runs.items()
  }
