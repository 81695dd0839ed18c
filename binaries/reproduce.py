r"""Reproduces a paper's comparison: algorithms x learning-rate grid, table and plot.

    python binaries/reproduce.py --experiment=fco_lasso       [--rounds=500]
    python binaries/reproduce.py --experiment=fco_nuclear
    python binaries/reproduce.py --experiment=fednova_synthetic
    python binaries/reproduce.py --experiment=drfl_imbalanced      (3 seeds)
    python binaries/reproduce.py --experiment=drfl_imbalanced_classes
    python binaries/reproduce.py --experiment=maml_sinewave        (3 seeds)
    python binaries/reproduce.py --experiment=damaml_dominant_class (3 seeds)

For each algorithm and each (client, server) learning rate on the grid, trains one run
(metrics in --output_dir/<experiment>/<algorithm>/lr_<c>_<s>/), then writes
`results.md` (the best metric over the grid at each checkpoint round, and the config
that achieved it) and `<experiment>.png` (the plotted metrics against rounds, for each
algorithm's best configuration by mean metric over all evaluations).
"""

import os

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')

# pylint: disable=g-import-not-at-top,wrong-import-position
import concurrent.futures
import csv
import dataclasses
import datetime
import itertools
import math
import multiprocessing
import pathlib
import platform
import sys
import time

from absl import app
from absl import flags
import matplotlib
import numpy as np
import tensorflow as tf

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

from tff_comp import experiment as experiment_lib
from tff_comp.binaries import flags_lib
from tff_comp.runtime import inprocess
from tff_comp.runtime import simulation


@dataclasses.dataclass(frozen=True)
class Experiment:
  """A grid comparison. `metric` picks the best configuration (`higher_is_better`
  orients it); `plot_metrics` are drawn side by side (default: `metric`)."""

  task: str
  algorithms: tuple[str, ...]
  client_learning_rates: tuple[float, ...]
  server_learning_rates: tuple[float, ...]
  rounds: int
  checkpoints: tuple[int, ...]
  metric: str
  higher_is_better: bool = True
  task_options: dict = dataclasses.field(default_factory=dict)
  algorithm_options: dict = dataclasses.field(default_factory=dict)  # name -> options
  settings: dict = dataclasses.field(default_factory=dict)  # ExperimentConfig fields
  plot_metrics: tuple[str, ...] = ()
  eval_period: int = 10
  seeds: tuple[int, ...] = ()  # default: the --seed flag
  aliases: dict = dataclasses.field(default_factory=dict)  # label -> registered name
  # label -> {metric: the evaluation metric to read instead} (Ditto's personal models)
  metric_sources: dict = dataclasses.field(default_factory=dict)


FCO_ALGORITHMS = ('fedmid', 'fedmid_osp', 'feddualavg', 'feddualavg_osp')
EXPERIMENTS = {
    # Yuan, Zaheer, Reddi (ICML 2021), Fig. 3: federated LASSO, dataset I.
    'fco_lasso': Experiment(
        task='lasso', algorithms=FCO_ALGORITHMS,
        client_learning_rates=(1e-4, 3e-4, 1e-3, 3e-3),
        server_learning_rates=(1.0, 3.0, 10.0, 30.0),
        rounds=500, checkpoints=(50, 100, 200, 500), metric='f1'),
    # Fig. 4: nuclear-norm matrix estimation, dataset I (rank 16).
    'fco_nuclear': Experiment(
        task='nuclear', algorithms=FCO_ALGORITHMS,
        client_learning_rates=(3e-4, 1e-3, 3e-3),
        server_learning_rates=(1.0, 10.0, 30.0),
        rounds=200, checkpoints=(50, 100, 200), metric='frobenius_error',
        higher_is_better=False, plot_metrics=('frobenius_error', 'rank')),
    # Wang et al. (NeurIPS 2020), Synthetic(1, 1) with local epochs ~ U(2, 5).
    'fednova_synthetic': Experiment(
        task='synthetic', algorithms=('fedavg', 'fedprox', 'fednova'),
        client_learning_rates=(0.01, 0.03, 0.1), server_learning_rates=(1.0,),
        rounds=200, checkpoints=(50, 100, 200), metric='test_accuracy',
        task_options=dict(alpha=1.0, beta=1.0),
        settings=dict(local_epochs=2, batch_size=50),
        algorithm_options=dict(fedavg=dict(local_epochs_max=5),
                               fedprox=dict(local_epochs_max=5, mu=0.01),
                               fednova=dict(local_epochs_max=5)),
        plot_metrics=('pooled_train_loss', 'test_accuracy')),
    # Huang and Li (ComFedL), DRFL: one big client, nine with 20 examples; 3 seeds.
    'drfl_imbalanced': Experiment(
        task='imbalanced_digits',
        algorithms=('fedavg', 'qfedavg', 'afl', 'comfedl', 'local_scgdm'),
        client_learning_rates=(0.003, 0.01, 0.03, 0.1), server_learning_rates=(1.0,),
        rounds=100, checkpoints=(20, 50, 100), metric='worst_accuracy',
        algorithm_options=dict(qfedavg=dict(q=0.2), afl=dict(lambda_learning_rate=0.08),
                               comfedl=dict(gamma=0.2, local_steps=5),
                               local_scgdm=dict(gamma=0.2, local_steps=5)),
        plot_metrics=('average_accuracy', 'worst_accuracy'), seeds=(0, 1, 2)),
}
# The harder construction: the big client holds classes 0-4, the small ones 5-9.
EXPERIMENTS['drfl_imbalanced_classes'] = dataclasses.replace(
    EXPERIMENTS['drfl_imbalanced'], task_options=dict(split='classes'))
# Fallah et al. (Per-FedAvg) and Gao et al. (Local-SCGDM): sinewave, MAML objective,
# personalized evaluation (one adaptation step on held-out clients); 3 seeds.
EXPERIMENTS['maml_sinewave'] = Experiment(
    task='sinewave',
    algorithms=('fedavg', 'per_fedavg_fo', 'per_fedavg_exact', 'comfedl_maml',
                'local_scgdm_maml'),
    aliases=dict(per_fedavg_fo='per_fedavg', per_fedavg_exact='per_fedavg',
                 comfedl_maml='comfedl', local_scgdm_maml='local_scgdm'),
    client_learning_rates=(0.003, 0.01), server_learning_rates=(1.0,),
    rounds=300, checkpoints=(100, 200, 300), metric='loss_after', higher_is_better=False,
    eval_period=20,
    algorithm_options=dict(
        per_fedavg_fo=dict(variant='fo', alpha=0.01, local_steps=10),
        per_fedavg_exact=dict(variant='exact', alpha=0.01, local_steps=10),
        comfedl_maml=dict(objective='maml', inner_learning_rate=0.01, local_steps=10),
        local_scgdm_maml=dict(objective='maml', inner_learning_rate=0.01, local_steps=10)),
    plot_metrics=('train/client_work/train_loss', 'loss_after'), seeds=(0, 1, 2))

# Huang and Li (ComFedL), DA-MAML setup: client i holds a fraction 0.28 of class i;
# inner (adaptation) lr 0.05, gamma 0.5, tau 5; baselines FedAvg, FedMAML (Per-FedAvg),
# TR-MAML, Ditto (scored with its personal models); 3 seeds.
EXPERIMENTS['damaml_dominant_class'] = Experiment(
    task='dominant_class',
    algorithms=('fedavg', 'per_fedavg', 'tr_maml', 'ditto', 'comfedl_damaml',
                'local_scgdm_damaml'),
    aliases=dict(comfedl_damaml='comfedl', local_scgdm_damaml='local_scgdm'),
    client_learning_rates=(0.03, 0.1, 0.3), server_learning_rates=(1.0,),
    rounds=100, checkpoints=(20, 50, 100), metric='worst_accuracy_after',
    task_options=dict(adapt_lr=0.05),
    algorithm_options=dict(
        per_fedavg=dict(variant='exact', alpha=0.05, local_steps=5),
        tr_maml=dict(alpha=0.05, local_steps=5),
        ditto=dict(lam=0.1),
        comfedl_damaml=dict(objective='da_maml', gamma=0.5, inner_learning_rate=0.05,
                            local_steps=5),
        local_scgdm_damaml=dict(objective='da_maml', gamma=0.5, inner_learning_rate=0.05,
                                local_steps=5)),
    metric_sources=dict(ditto=dict(accuracy_after='personal_accuracy',
                                   worst_accuracy_after='personal_worst_accuracy')),
    plot_metrics=('accuracy_after', 'worst_accuracy_after'), seeds=(0, 1, 2))

_EXPERIMENT = flags.DEFINE_enum('experiment', 'fco_lasso', list(EXPERIMENTS), 'Which comparison.')
_ROUNDS = flags.DEFINE_integer('rounds', None, 'Override the experiment\'s rounds.')
_SEED = flags.DEFINE_integer(
    'seed', 0, 'Run seed (client sampling) of experiments without their own seeds.')
_DATA_SEED = flags.DEFINE_integer(
    'data_seed', None, 'Seed of the task data for every run (default: each run\'s seed,'
    ' as for the committed results: each seed draws its own data and sampling).')
_OUTPUT = flags.DEFINE_string(
    'output_dir', 'runs/reproduce', 'Where results go (the committed ones are in results/).')
_OVERWRITE = flags.DEFINE_bool('overwrite', False, 'Replace runs already in --output_dir.')
_RESUME = flags.DEFINE_bool(
    'resume', False, 'Continue an interrupted grid: finished configurations are read'
    ' back, an interrupted one continues from its last checkpoint.')
_CHECKPOINT_EVERY = flags.DEFINE_integer(
    'checkpoint_every', 100, 'Rounds between saved states of each run (for --resume).')
_PARALLEL = flags.DEFINE_integer(
    'parallel', 1, 'Run (algorithm, seed) groups in this many processes.')
_RUNTIME = flags.DEFINE_enum('runtime', 'auto', experiment_lib.runtime_names(),
                             'Where rounds run (see run.py --helpfull).')
_ENGINE = flags.DEFINE_enum('engine', 'auto', list(inprocess.ENGINES),
                            'The in-process runtime\'s engine (see run.py --helpfull).')
_ALGORITHMS = flags.DEFINE_list(
    'algorithms', None, 'Train only these of the experiment\'s algorithms (default: all);'
    ' the table then covers them only: --summarize_only rebuilds it from all saved runs.')
_CLIENT_LRS = flags.DEFINE_list(
    'client_learning_rates', None, 'Override the grid\'s client learning rates (e.g. 0.001,0.003).')
_SERVER_LRS = flags.DEFINE_list(
    'server_learning_rates', None, 'Override the grid\'s server learning rates.')
_SEEDS = flags.DEFINE_integer(
    'seeds', None, 'Run only the first N of the experiment\'s seeds (a quicker check).',
    lower_bound=1)
_EVAL_PERIOD = flags.DEFINE_integer('eval_period', None,
                                    'Override the experiment\'s evaluation period.',
                                    lower_bound=1)
_SUMMARIZE_ONLY = flags.DEFINE_bool(
    'summarize_only', False, 'Rebuild results.md and the plot from runs already saved.')


def _column(metric: str) -> str:
  """A metric's metrics.csv column: evaluation metrics by name, others by full path
  (e.g. 'train/client_work/train_loss')."""
  return metric if '/' in metric else f'eval/{metric}'


def _read_curves(path: pathlib.Path, metrics, sources) -> dict[str, dict[int, float]]:
  """{metric: {round: value}} from a run's metrics.csv (rows that have the metric),
  reading metric m from column `sources[m]` when given."""
  with open(path / 'metrics.csv') as f:
    rows = list(csv.DictReader(f))
  columns = {m: _column(sources.get(m, m)) for m in metrics}
  return {m: {int(r['round']): float(r[columns[m]]) for r in rows if r.get(columns[m])}
          for m in metrics}


def _plotted(spec: Experiment) -> tuple[str, ...]:
  return spec.plot_metrics or (spec.metric,)


def _run_dir(root, algorithm, lr_c, lr_s, seed, seeds) -> pathlib.Path:
  out = root / algorithm / f'lr_{lr_c:g}_{lr_s:g}'
  return out / f'seed_{seed}' if len(seeds) > 1 else out


def _run_group(name: str, spec: Experiment, algorithm: str, seed: int, rounds: int,
               seeds, root: pathlib.Path, options: dict) -> dict:
  """Trains one algorithm with one seed over the learning-rate grid (built once; the grid
  sets learning rates through the hparams). Returns {(c, s): {metric: curve}}."""
  grid = list(itertools.product(spec.client_learning_rates, spec.server_learning_rates))
  metrics = _plotted(spec) + (spec.metric,)
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
    out = _run_dir(root, algorithm, lr_c, lr_s, seed, seeds)
    start = time.monotonic()
    try:
      experiment_lib.train(
          prepared, runner, show_progress=False, learning_rates=(lr_c, lr_s),
          output_dir=str(out), extra_config={
              'experiment': name, 'grid_algorithm': algorithm,
              'client_learning_rate': lr_c, 'server_learning_rate': lr_s})
    except simulation.DivergenceError as e:
      print(f'{algorithm} lr=({lr_c:g}, {lr_s:g}) seed {seed}: {e}')
    curves[(lr_c, lr_s)] = _read_curves(out, metrics, spec.metric_sources.get(algorithm, {}))
    final = curves[(lr_c, lr_s)][spec.metric]
    last = max(final)
    outcome = (f'{spec.metric}={final[last]:.4g} at round {last}' if last >= rounds
               else f'diverged at round {_diverged_at(curves[(lr_c, lr_s)])}')
    print(f'{algorithm:15s} eta_c={lr_c:<7g} eta_s={lr_s:<5g} seed={seed} {outcome}'
          f' ({time.monotonic() - start:.0f}s)', flush=True)
  return curves


def run_grid(name: str, spec: Experiment, rounds: int, seeds, root: pathlib.Path,
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


def _diverged_at(run) -> int:
  """The round a stopped run diverged in: the loop writes no row for it, so the one
  after its last row."""
  return max(max(curve, default=0) for curve in run.values()) + 1


def _at(runs, metric, round_num) -> list[float]:
  """The metric at `round_num` in each seed's run that reached it."""
  return [r[metric][round_num] for r in runs if round_num in r[metric]]


def _cell(runs, metric: str, round_num: int, seeds: int) -> str:
  values = _at(runs, metric, round_num)
  if len(values) < seeds:
    return f'diverged at round {min(_diverged_at(r) for r in runs if round_num not in r[metric])}'
  if seeds == 1:
    return f'{values[0]:.4g}'
  return f'{np.mean(values):.4g} ± {np.std(values):.2g}'


def machine() -> str:
  """What ran the grid: CPUs (with the model where Linux names it) and GPUs."""
  model = platform.processor() or platform.machine()
  try:
    with open('/proc/cpuinfo') as f:
      model = next(line.split(':', 1)[1].strip() for line in f
                   if line.startswith('model name'))
  except (OSError, StopIteration):
    pass
  gpus = len(tf.config.list_physical_devices('GPU'))
  return f'{os.cpu_count()} CPUs ({model}), {f"{gpus} GPU(s)" if gpus else "no GPU"}'


def _zoom(ax, values: list[float], log: bool) -> None:
  """y-limits fit to `values` (the curves from the first checkpoint on), so the early
  rounds' values (an untrained model's) do not flatten the differences that matter."""
  values = [v for v in values if math.isfinite(v) and (v > 0 or not log)]
  if not values:
    return
  low, high = (np.log10(min(values)), np.log10(max(values))) if log else (
      min(values), max(values))
  pad = 0.08 * (high - low) or 0.05 * (abs(high) or 1)
  low, high = low - pad, high + pad
  ax.set_ylim(*((10**low, 10**high) if log else (low, high)))


def summarize(name, spec, curves, rounds, root: pathlib.Path, command: str,
              provenance: str = '') -> str:
  """Writes results.md and the PNG; returns the markdown. `provenance`: how long the
  grid took and on what machine (a line under the command).

  With several seeds a configuration's value is the mean over seeds (± standard
  deviation in the tables) and a run that diverged disqualifies the configuration.
  """
  pick = max if spec.higher_is_better else min
  # A shortened run tables the checkpoints it reached, and always its last round.
  checkpoints = sorted({c for c in spec.checkpoints if c < rounds} | {rounds})
  plotted = _plotted(spec)
  seeds = max(len(runs) for by_lr in curves.values() for runs in by_lr.values())
  over = f' over {seeds} seeds' if seeds > 1 else ''
  lines = [f'# {name}: best {spec.metric} over the learning-rate grid{over}', '',
           f'Command: `{command}`', '', *([provenance, ''] if provenance else []),
           '| algorithm | ' + ' | '.join(f'round {c}' for c in checkpoints) + ' |',
           '|---|' + '---|' * len(checkpoints)]
  for algorithm, by_lr in curves.items():
    cells = []
    for c in checkpoints:
      values = {lr: float(np.mean(_at(runs, spec.metric, c)))
                for lr, runs in by_lr.items() if len(_at(runs, spec.metric, c)) == seeds}
      if not values:
        cells.append('every rate diverged')
        continue
      best_lr = pick(values, key=values.get)
      cells.append(f'{_cell(by_lr[best_lr], spec.metric, c, seeds)} '
                   f'({best_lr[0]:g}, {best_lr[1]:g})')
    lines.append(f'| {algorithm} | ' + ' | '.join(cells) + ' |')
  lines += ['', 'Cells: best value at that round, (eta_c, eta_s) achieving it.', '',
            f'Each algorithm\'s best configuration by mean {spec.metric} over all '
            f'evaluations{over} (the curves in `{name}.png`):', '',
            '| algorithm | (eta_c, eta_s) | ' + ' | '.join(
                f'{m} @ {c}' for m in plotted for c in checkpoints) + ' |',
            '|---|---|' + '---|' * (len(plotted) * len(checkpoints))]
  fig, axes = plt.subplots(1, len(plotted), figsize=(6.5 * len(plotted), 4.5), squeeze=False)
  markers = {m: itertools.cycle('osD^vP*X') for m in plotted}  # no line hides another
  settled = {m: [] for m in plotted}  # values drawn from the first checkpoint on
  for algorithm, by_lr in curves.items():
    scored = {lr: float(np.mean([np.mean(list(r[spec.metric].values())) for r in runs]))
              for lr, runs in by_lr.items()
              if len(runs) == seeds and all(r[spec.metric] for r in runs)}
    complete = {lr: v for lr, v in scored.items()
                if all(max(r[spec.metric]) >= rounds for r in by_lr[lr])}
    best = pick(complete or scored, key=(complete or scored).get)
    runs = by_lr[best]
    cells = [_cell(runs, m, c, seeds) for m in plotted for c in checkpoints]
    lines.append(f'| {algorithm} | ({best[0]:g}, {best[1]:g}) | ' + ' | '.join(cells) + ' |')
    sources = spec.metric_sources.get(algorithm, {})
    for ax, metric in zip(axes[0], plotted):
      common = sorted(set.intersection(*(set(r[metric]) for r in runs)))
      values = np.array([[r[metric][x] for x in common] for r in runs])
      source = f' [{sources[metric]}]' if metric in sources else ''
      settled[metric] += [v for x, *drawn in zip(common, values.min(0), values.max(0))
                          if x >= checkpoints[0] for v in drawn]  # bands included
      line, = ax.plot(common, values.mean(0), marker=next(markers[metric]),
                      markevery=max(1, len(common) // 8), markersize=5,
                      label=f'{algorithm}{source} (eta_c={best[0]:g}, eta_s={best[1]:g})')
      if seeds > 1:  # the spread over seeds
        ax.fill_between(common, values.min(0), values.max(0), color=line.get_color(),
                        alpha=0.15, linewidth=0)
  for ax, metric in zip(axes[0], plotted):
    log = 'loss' in metric or 'error' in metric
    if log:
      ax.set_yscale('log')  # one unstable method must not flatten the others
    _zoom(ax, settled[metric], log)
    ax.set_xlabel('round')
    ax.set_ylabel(metric)
    spread = f'mean over {seeds} seeds, band: min to max; ' if seeds > 1 else ''
    ax.set_title(f'{metric} of each algorithm at its best rates\n{name} on {spec.task}\n'
                 f'{spread}y-axis fit to rounds >= {checkpoints[0]}', fontsize=10)
    ax.grid(alpha=0.3, which='both')
    # Below the plot, where it hides no curve.
    ax.legend(fontsize=8, loc='upper center', bbox_to_anchor=(0.5, -0.15), ncol=2)
  fig.tight_layout()
  fig.savefig(root / f'{name}.png', dpi=120, bbox_inches='tight')
  table = '\n'.join(lines) + '\n'
  (root / 'results.md').write_text(table)
  return table


def _earlier_record(path: pathlib.Path) -> tuple[str, str] | None:
  """(command, timing line or '') of an earlier results.md, if there is one."""
  if not path.exists():
    return None
  lines = path.read_text().splitlines()
  commands = [line[len('Command: `'):-1] for line in lines if line.startswith('Command: `')]
  took = next((line for line in lines if line.startswith('Took ')), '')
  return (commands[0], took.split(' Tables and plot rewritten')[0]) if commands else None


def _steered(spec: Experiment) -> Experiment:
  """`spec` with the grid and evaluation period the command line overrides."""
  changes = {}
  for flag, field in ((_CLIENT_LRS, 'client_learning_rates'),
                      (_SERVER_LRS, 'server_learning_rates')):
    if flag.value:
      try:
        changes[field] = tuple(float(v) for v in flag.value)
      except ValueError as e:
        raise ValueError(f'--{field}: {",".join(flag.value)} is not a list of numbers.') from e
      if not all(math.isfinite(v) and v > 0 for v in changes[field]):
        raise ValueError(f'--{field} must be positive finite numbers.')
  if _EVAL_PERIOD.value:
    changes['eval_period'] = _EVAL_PERIOD.value
  return dataclasses.replace(spec, **changes)


@flags_lib.closing_stdout_quietly
def main(argv):
  if len(argv) > 1:
    flags_lib.fail(f'unexpected arguments: {" ".join(argv[1:])}')
  name = _EXPERIMENT.value
  try:
    spec = _steered(EXPERIMENTS[name])
  except ValueError as e:
    flags_lib.fail(str(e))
  rounds = _ROUNDS.value or spec.rounds
  root = pathlib.Path(_OUTPUT.value) / name
  root.mkdir(parents=True, exist_ok=True)
  seeds = spec.seeds or (_SEED.value,)
  if _SEEDS.value:
    seeds = seeds[:_SEEDS.value]
  if _ALGORITHMS.value:
    unknown = sorted(set(_ALGORITHMS.value) - set(spec.algorithms))
    if unknown:
      flags_lib.fail(f'--algorithms: {unknown} not in {name}: {spec.algorithms}')
    spec = dataclasses.replace(spec, algorithms=tuple(
        a for a in spec.algorithms if a in _ALGORITHMS.value))
  if _SUMMARIZE_ONLY.value:
    metrics = _plotted(spec) + (spec.metric,)
    curves = {a: {(c, s): [_read_curves(_run_dir(root, a, c, s, seed, seeds), metrics,
                                        spec.metric_sources.get(a, {}))
                           for seed in seeds]
                  for c, s in itertools.product(spec.client_learning_rates,
                                                spec.server_learning_rates)}
              for a in spec.algorithms}
  # The command that ran, as it was given (flag values included).
  command = ' '.join(['python binaries/reproduce.py', *sys.argv[1:]])
  if _SUMMARIZE_ONLY.value:
    # The runs' own command and timing stay, from the results.md being rewritten.
    earlier = _earlier_record(root / 'results.md')
    provenance = f'Tables and plot rewritten by `{command}`.'
    if earlier:
      command, took = earlier
      provenance = f'{took} {provenance}'.strip()
  else:
    start = time.monotonic()
    try:
      curves = run_grid(name, spec, rounds, seeds, root, _RUNTIME.value,
                        engine=_ENGINE.value, data_seed=_DATA_SEED.value, overwrite=_OVERWRITE.value,
                        resume=_RESUME.value, checkpoint_every=_CHECKPOINT_EVERY.value,
                        parallel=_PARALLEL.value)
    except experiment_lib.ConfigError as e:
      flags_lib.fail(str(e))
    minutes, seconds = divmod(round(time.monotonic() - start), 60)
    provenance = (f'Took {minutes} min {seconds} s on {machine()},'
                  f' {datetime.date.today()} (--parallel={_PARALLEL.value}).')
  print(summarize(name, spec, curves, rounds, root, command, provenance))


if __name__ == '__main__':
  app.run(main, flags_parser=flags_lib.parse_or_fail)
