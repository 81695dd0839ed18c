"""The reproductions' summaries: results.md (the best configuration at each checkpoint,
mean and spread over seeds) and the plot of each algorithm's best curves."""

import itertools
import math
import os
import pathlib
import platform

import matplotlib
import numpy as np
import tensorflow as tf

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top,wrong-import-position

from tff_comp.binaries import grid  # pylint: disable=g-import-not-at-top,wrong-import-position


def _at(runs, metric, round_num) -> list[float]:
  """The metric at `round_num` in each seed's run that reached it."""
  return [r[metric][round_num] for r in runs if round_num in r[metric]]


def _cell(runs, metric: str, round_num: int, seeds: int) -> str:
  values = _at(runs, metric, round_num)
  if len(values) < seeds:
    return f'diverged at round {min(grid.diverged_at(r) for r in runs if round_num not in r[metric])}'
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


def zoom(ax, values: list[float], log: bool) -> None:
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
  plotted = grid.plotted(spec)
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
    zoom(ax, settled[metric], log)
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


def earlier_record(path: pathlib.Path) -> tuple[str, str] | None:
  """(command, timing line or '') of an earlier results.md, if there is one."""
  if not path.exists():
    return None
  lines = path.read_text().splitlines()
  commands = [line[len('Command: `'):-1] for line in lines if line.startswith('Command: `')]
  took = next((line for line in lines if line.startswith('Took ')), '')
  return (commands[0], took.split(' Tables and plot rewritten')[0]) if commands else None
