"""The grid runner of the reproductions: every (algorithm, configuration, seed) of an
`reproductions.Reproduction`, trained through the library's run path (`experiment.prepare`,
`build_runner` once per algorithm, seed and build option, `train` per configuration),
and the curves read back from each run's metrics.csv."""

import concurrent.futures
import csv
import multiprocessing
import pathlib
import time

from tff_comp import experiment as experiment_lib
from tff_comp.binaries import reproductions
from tff_comp.runtime import callbacks


def column(metric: str) -> str:
  """A metric's metrics.csv column: evaluation metrics by name, others by full path
  (e.g. 'train/client_work/train_loss')."""
  return metric if '/' in metric else f'eval/{metric}'


def read_curves(path: pathlib.Path, metrics, sources) -> dict[str, dict[int, float]]:
  """{metric: {round: value}} from a run's metrics.csv (rows that have the metric),
  reading metric m from column `sources[m]` when given."""
  with open(path / 'metrics.csv') as f:
    rows = list(csv.DictReader(f))
  columns = {m: column(sources.get(m, m)) for m in metrics}
  return {m: {int(r['round']): float(r[columns[m]]) for r in rows if r.get(columns[m])}
          for m in metrics}


def plotted(spec: reproductions.Reproduction) -> tuple[str, ...]:
  return spec.plot_metrics or (spec.metric,)


def recorded(spec: reproductions.Reproduction) -> tuple[str, ...]:
  """The metrics read back from each run: those plotted, reported and selected on."""
  return tuple(dict.fromkeys(plotted(spec) + (spec.metric, reproductions.selection(spec)[0])))


def run_dir(root, algorithm, config, seed, seeds, names=()) -> pathlib.Path:
  """Where one run of the grid writes: `lr_<eta_c>_<eta_s>`, then `_<name>_<value>` for
  each of the algorithm's own axes (`names`, after the learning rates), then the seed."""
  lr_c, lr_s, *own = config
  out = root / algorithm / (f'lr_{lr_c:g}_{lr_s:g}' + ''.join(
      f'_{name}_{value:g}' for name, value in zip(names[2:], own)))
  return out / f'seed_{seed}' if len(seeds) > 1 else out


def _prepare(spec: reproductions.Reproduction, algorithm: str, seed: int, rounds: int,
             root: pathlib.Path, options: dict, algorithm_options: dict):
  # output_dir: the algorithm's folder of per-configuration runs, so preparing never
  # looks at run.py's default runs/<algo>-<task> (a `make run` there must not stop a grid).
  config = experiment_lib.ExperimentConfig.of(
      algorithm=spec.aliases.get(algorithm, algorithm), task=spec.task, rounds=rounds,
      output_dir=str(root / algorithm),
      seed=seed, eval_period=spec.eval_period, task_options=dict(spec.task_options),
      algorithm_options={**spec.algorithm_options.get(algorithm, {}), **algorithm_options},
      **options, **spec.settings, **spec.algorithm_settings.get(algorithm, {}))
  prepared = experiment_lib.prepare(config)
  return prepared, experiment_lib.build_runner(prepared)


def _run_group(name: str, spec: reproductions.Reproduction, algorithm: str, seed: int, rounds: int,
               seeds, root: pathlib.Path, options: dict) -> dict:
  """Trains one algorithm with one seed over its grid. The learning rates and the client
  work's own hparams are set through the hparams of one build; other tuned options get
  a build per value. Returns {configuration: {metric: curve}}."""
  names = list(reproductions.axes(spec, algorithm))
  metrics = recorded(spec)
  base = _prepare(spec, algorithm, seed, rounds, root, options, {})
  rule = base[1].algorithm.client_rule if base[1].algorithm is not None else None
  hparams = set(rule.initial_hparams()) if rule is not None else set()
  built = {(): base}
  curves = {}
  for config in reproductions.configurations(spec, algorithm):
    values = dict(zip(names, config))
    client_hparams = {k: v for k, v in values.items()
                      if k not in reproductions.LEARNING_RATES and k in hparams}
    build_options = {k: v for k, v in values.items()
                     if k not in reproductions.LEARNING_RATES and k not in hparams}
    key = tuple(sorted(build_options.items()))
    if key not in built:
      built[key] = _prepare(spec, algorithm, seed, rounds, root, options, build_options)
    prepared, runner = built[key]
    out = run_dir(root, algorithm, config, seed, seeds, names)
    start = time.monotonic()
    label = reproductions.describe(spec, algorithm, config)
    try:
      experiment_lib.train_runner(
          prepared, runner, show_progress=False, learning_rates=config[:2],
          callbacks=experiment_lib.default_callbacks(prepared, runner, show_progress=False),
          client_hparams=client_hparams, output_dir=str(out), extra_config={
              'experiment': name, 'grid_algorithm': algorithm,
              'client_learning_rate': config[0], 'server_learning_rate': config[1],
              'grid_configuration': values})
    except callbacks.DivergenceError as e:
      print(f'{algorithm} {label} seed {seed}: {e}')
    curves[config] = read_curves(out, metrics, spec.metric_sources.get(algorithm, {}))
    final = curves[config][spec.metric]
    last = max(final)
    outcome = (f'{spec.metric}={final[last]:.4g} at round {last}' if last >= rounds
               else f'diverged at round {diverged_at(curves[config])}')
    print(f'{algorithm:15s} {label} seed={seed} {outcome}'
          f' ({time.monotonic() - start:.0f}s)', flush=True)
  return curves


def run_grid(name: str, spec: reproductions.Reproduction, rounds: int, seeds, root: pathlib.Path,
             runtime: str = 'auto', *, engine: str = 'auto', data_seed: int | None = None,
             overwrite: bool = False, resume: bool = False, checkpoint_every: int = 100,
             parallel: int = 1):
  """Trains every (algorithm, configuration, seed); `data_seed` None: each run's data
  seed is its seed. `resume`: finished configurations are read back, an interrupted one
  continues from its checkpoint. `parallel` > 1: (algorithm, seed) groups run in that
  many processes.

  Returns {algorithm: {configuration: [{metric: curve} per seed]}}, a configuration
  being the values of `reproductions.axes` in order: (eta_c, eta_s, own values...).
  """
  options = dict(data_seed=data_seed, overwrite=overwrite, resume=resume,
                 checkpoint_every=checkpoint_every, runtime=runtime, engine=engine)
  groups = [(a, seed) for a in spec.algorithms for seed in seeds]
  args = [(name, spec, a, seed, rounds, seeds, root, options) for a, seed in groups]
  if parallel > 1:
    # Fresh interpreters (spawn): TensorFlow's runtime does not survive a fork.
    with concurrent.futures.ProcessPoolExecutor(
        parallel, mp_context=multiprocessing.get_context('spawn')) as pool:
      results = list(pool.map(_run_group, *zip(*args)))
  else:
    results = [_run_group(*a) for a in args]
  curves: dict[str, dict[tuple[float, ...], list]] = {
      a: {config: [] for config in reproductions.configurations(spec, a)}
      for a in spec.algorithms}
  for (algorithm, _), result in zip(groups, results):
    for config, curve in result.items():
      curves[algorithm][config].append(curve)
  return curves


def diverged_at(run) -> int:
  """The round a stopped run diverged in: the loop writes no row for it, so the one
  after its last row."""
  return max(max(curve, default=0) for curve in run.values()) + 1




def read_grid(spec: reproductions.Reproduction, seeds, root: pathlib.Path):
  """The curves of a grid's saved runs (as `run_grid` returns them), without training."""
  metrics = recorded(spec)
  return {a: {config: [read_curves(run_dir(root, a, config, seed, seeds,
                                           list(reproductions.axes(spec, a))),
                                   metrics, spec.metric_sources.get(a, {}))
                       for seed in seeds]
              for config in reproductions.configurations(spec, a)}
          for a in spec.algorithms}
