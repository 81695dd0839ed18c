"""The grid runner of the reproductions: every (algorithm, learning-rate pair, seed) of
an `experiments.Experiment`, trained through the library's run path
(`experiment.prepare`, `build_runner` once per algorithm and seed, `train` per rate
pair), and the curves read back from each run's metrics.csv."""

import concurrent.futures
import csv
import itertools
import multiprocessing
import pathlib
import time

from tff_comp import experiment as experiment_lib
from tff_comp.binaries import experiments
from tff_comp.runtime import simulation


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


def plotted(spec: experiments.Experiment) -> tuple[str, ...]:
  return spec.plot_metrics or (spec.metric,)


def run_dir(root, algorithm, lr_c, lr_s, seed, seeds) -> pathlib.Path:
  out = root / algorithm / f'lr_{lr_c:g}_{lr_s:g}'
  return out / f'seed_{seed}' if len(seeds) > 1 else out


def _run_group(name: str, spec: experiments.Experiment, algorithm: str, seed: int, rounds: int,
               seeds, root: pathlib.Path, options: dict) -> dict:
  """Trains one algorithm with one seed over the learning-rate grid (built once; the grid
  sets learning rates through the hparams). Returns {(c, s): {metric: curve}}."""
  grid = list(itertools.product(spec.client_learning_rates, spec.server_learning_rates))
  metrics = plotted(spec) + (spec.metric,)
  # output_dir: the algorithm's folder of per-rate runs, so preparing never looks at
  # run.py's default runs/<algo>-<task> (a `make run` there must not stop a grid).
  config = experiment_lib.ExperimentConfig(
      algorithm=spec.aliases.get(algorithm, algorithm), task=spec.task, rounds=rounds,
      output_dir=str(root / algorithm),
      seed=seed, eval_period=spec.eval_period, task_options=dict(spec.task_options),
      algorithm_options=dict(spec.algorithm_options.get(algorithm, {})),
      **options, **spec.settings)
  prepared = experiment_lib.prepare(config)
  runner = experiment_lib.build_runner(prepared)
  curves = {}
  for lr_c, lr_s in grid:
    out = run_dir(root, algorithm, lr_c, lr_s, seed, seeds)
    start = time.monotonic()
    try:
      experiment_lib.train(
          prepared, runner, show_progress=False, learning_rates=(lr_c, lr_s),
          output_dir=str(out), extra_config={
              'experiment': name, 'grid_algorithm': algorithm,
              'client_learning_rate': lr_c, 'server_learning_rate': lr_s})
    except simulation.DivergenceError as e:
      print(f'{algorithm} lr=({lr_c:g}, {lr_s:g}) seed {seed}: {e}')
    curves[(lr_c, lr_s)] = read_curves(out, metrics, spec.metric_sources.get(algorithm, {}))
    final = curves[(lr_c, lr_s)][spec.metric]
    last = max(final)
    outcome = (f'{spec.metric}={final[last]:.4g} at round {last}' if last >= rounds
               else f'diverged at round {diverged_at(curves[(lr_c, lr_s)])}')
    print(f'{algorithm:15s} eta_c={lr_c:<7g} eta_s={lr_s:<5g} seed={seed} {outcome}'
          f' ({time.monotonic() - start:.0f}s)', flush=True)
  return curves


def run_grid(name: str, spec: experiments.Experiment, rounds: int, seeds, root: pathlib.Path,
             runtime: str = 'auto', *, engine: str = 'auto', data_seed: int | None = None,
             overwrite: bool = False, resume: bool = False, checkpoint_every: int = 100,
             parallel: int = 1):
  """Trains every (algorithm, lr pair, seed); `data_seed` None: each run's data seed
  is its seed. `resume`: finished configurations are read back, an interrupted one
  continues from its checkpoint. `parallel` > 1: (algorithm, seed) groups run in that
  many processes.

  Returns {algorithm: {(c, s): [{metric: curve} per seed]}}.
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
  curves: dict[str, dict[tuple[float, float], list]] = {
      a: {lr: [] for lr in itertools.product(spec.client_learning_rates,
                                             spec.server_learning_rates)}
      for a in spec.algorithms}
  for (algorithm, _), result in zip(groups, results):
    for lr, curve in result.items():
      curves[algorithm][lr].append(curve)
  return curves


def diverged_at(run) -> int:
  """The round a stopped run diverged in: the loop writes no row for it, so the one
  after its last row."""
  return max(max(curve, default=0) for curve in run.values()) + 1




def read_grid(spec: experiments.Experiment, seeds, root: pathlib.Path):
  """The curves of a grid's saved runs (as `run_grid` returns them), without training."""
  metrics = plotted(spec) + (spec.metric,)
  return {a: {(c, s): [read_curves(run_dir(root, a, c, s, seed, seeds), metrics,
                                   spec.metric_sources.get(a, {}))
                       for seed in seeds]
              for c, s in itertools.product(spec.client_learning_rates,
                                            spec.server_learning_rates)}
          for a in spec.algorithms}
