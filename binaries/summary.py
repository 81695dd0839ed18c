"""The reproductions' summaries: results.md (each algorithm at the configuration selected
on validation data, mean and spread over seeds; every configuration's score) and the plot
of each algorithm's curves at its selected configuration."""

import os
import pathlib
import platform

import numpy as np
import tensorflow as tf

from tff_comp.binaries import figures, grid, reproductions


def _at(runs, metric, round_num) -> list[float]:
  """The metric at `round_num` in each seed's run that reached it."""
  return [r[metric][round_num] for r in runs if round_num in r[metric]]


def _cell(runs, metric: str, round_num: int, seeds: int) -> str:
  values = _at(runs, metric, round_num)
  if len(values) < seeds:
    return (
      f'diverged at round {min(grid.diverged_at(r) for r in runs if round_num not in r[metric])}'
    )
  if seeds == 1:
    return f'{values[0]:.4g}'
  mean, std = np.mean(values), np.std(values)
  # Equal values can leave a rounding residue (1e-16) in the spread: that is 0.
  return f'{mean:.4g} ± {0.0 if std <= 1e-9 * max(1.0, abs(mean)) else std:.2g}'


def _times(run, x_axis: str) -> dict[int, float]:
  """Each round's value of the column `x_axis` (round 0, the start: 0)."""
  return {0: 0.0, **run[x_axis]}


def _reached(runs, spec, seeds: int) -> str:
  """When each seed's `spec.metric` first reached `spec.target` (on the x-axis column):
  mean ± standard deviation, or how many seeds never did."""
  better = (lambda v: v >= spec.target) if spec.higher_is_better else (lambda v: v <= spec.target)
  times = []
  for run in runs:
    at = _times(run, spec.x_axis)
    hits = [k for k, v in sorted(run[spec.metric].items()) if better(v)]
    if hits:
      times.append(at[hits[0]])
  if len(times) < len(runs):
    return f'not reached by {len(runs) - len(times)} of {len(runs)} seeds' + (
      f' (the others: {np.mean(times):.4g})' if times else ''
    )
  if seeds == 1:
    return f'{times[0]:.4g}'
  return f'{np.mean(times):.4g} ± {np.std(times):.2g}'


def _against(runs, metric: str, x_axis: str) -> tuple[np.ndarray, np.ndarray]:
  """(x, [seed, x] values): each seed's `metric` at its evaluations, interpolated onto
  100 points of the x-axis column up to where every seed's run reached."""
  points = []
  for run in runs:
    at = _times(run, x_axis)
    rounds = sorted(k for k in run[metric] if k in at)
    points.append((np.array([at[k] for k in rounds]), np.array([run[metric][k] for k in rounds])))
  grid_x = np.linspace(0.0, min(x[-1] for x, _ in points), 100)
  return grid_x, np.array([np.interp(grid_x, x, v) for x, v in points])


def machine() -> str:
  """What ran the grid: CPUs (with the model where Linux names it) and GPUs."""
  model = platform.processor() or platform.machine()
  try:
    with open('/proc/cpuinfo') as f:
      model = next(line.split(':', 1)[1].strip() for line in f if line.startswith('model name'))
  except (OSError, StopIteration):
    pass
  gpus = len(tf.config.list_physical_devices('GPU'))
  return f'{os.cpu_count()} CPUs ({model}), {f"{gpus} GPU(s)" if gpus else "no GPU"}'


def _score(runs, metric: str) -> float:
  """A configuration's selection score: the mean over seeds of `metric` averaged over
  every evaluation of the run (so it rewards early progress and the end alike)."""
  return float(np.mean([np.mean(list(r[metric].values())) for r in runs]))


def _select(spec, by_config, seeds: int, rounds: int):
  """(best configuration, {configuration: score}): only configurations every seed ran to
  the end compete (one divergence disqualifies); if none did, the longest-running."""
  select, higher = reproductions.selection(spec)
  pick = max if higher else min
  scored = {
    config: _score(runs, select)
    for config, runs in by_config.items()
    if len(runs) == seeds and all(r[select] for r in runs)
  }
  complete = {
    config: v
    for config, v in scored.items()
    if all(max(r[select]) >= rounds for r in by_config[config])
  }
  candidates = complete or scored
  return pick(candidates, key=candidates.get), complete


def grid_edges(spec, algorithm: str, config: tuple[float, ...]) -> list[str]:
  """The axes on which `config` takes the smallest or largest value tried (of axes
  with several values): where a wider grid might have found better."""
  edges = []
  for (axis, values), value in zip(reproductions.axes(spec, algorithm).items(), config):
    if len(values) > 1 and value in (min(values), max(values)):
      side = 'largest' if value == max(values) else 'smallest'
      edges.append(f'{reproductions.SHORT_NAMES.get(axis, axis)}={value:g} ({side} tried)')
  return edges


def summarize(
  name, spec, curves, rounds, root: pathlib.Path, command: str, provenance: str = ''
) -> str:
  """Writes results.md and the figure (`figures.draw`: PNG, PDF, SVG); returns the
  markdown. `provenance`: how long the grid took and on what machine (a line under the
  command).

  Each algorithm's configuration is selected once, on `reproductions.selection(spec)`
  (validation data where the task has it), and its reported metrics are read at that
  configuration; values are means over seeds (± standard deviation).
  """
  select, higher = reproductions.selection(spec)
  # A shortened run tables the checkpoints it reached, and always its last round.
  checkpoints = sorted({c for c in spec.checkpoints if c < rounds} | {rounds})
  plotted = grid.plotted(spec)
  reported = tuple(dict.fromkeys((spec.metric,) + plotted))
  seeds = max(len(runs) for by_config in curves.values() for runs in by_config.values())
  over = f' over {seeds} seeds' if seeds > 1 else ''
  sizes = {a: len(by_config) for a, by_config in curves.items()}
  budget = (
    f'{next(iter(sizes.values()))} configurations each'
    if len(set(sizes.values())) == 1
    else 'grids of ' + ', '.join(f'{a}: {n}' for a, n in sizes.items())
  )
  on = f'`{select}`' + (
    ' (validation data)'
    if select.startswith('validation_')
    else f' (not `{spec.metric}`)'
    if select != spec.metric
    else ''
  )
  reach = (
    f'{spec.x_axis} to {spec.metric} {"≥" if spec.higher_is_better else "≤"} {spec.target:g}'
    if spec.x_axis and spec.target is not None
    else ''
  )
  lines = [
    f'# {name}: each algorithm at its selected configuration{over}',
    '',
    f'Command: `{command}`',
    '',
    *([provenance, ''] if provenance else []),
    f'Tuning: every algorithm searched its own grid ({budget}; the grids are listed'
    f" below). Each algorithm's configuration is the one with the"
    f' {"highest" if higher else "lowest"} mean over seeds of {on} averaged over'
    ' all evaluations; a configuration where any seed diverged is out. The'
    f" table reports that configuration's metrics (mean ± standard deviation{over});"
    f' the curves are in `{name}.png` (.pdf, .svg)'
    + (
      ': each the mean over seeds, its band from the lowest seed to the highest.'
      if seeds > 1
      else '.'
    ),
    '',
    '| algorithm | selected configuration | '
    + ' | '.join(f'{m} @ {c}' for m in reported for c in checkpoints)
    + (f' | {reach}' if reach else '')
    + ' |',
    '|---|---|' + '---|' * (len(reported) * len(checkpoints) + bool(reach)),
  ]
  # Panels: each plotted metric against rounds, then against the x-axis column.
  by_rounds = {m: [] for m in plotted}
  by_x = {m: [] for m in plotted}
  every = []  # the full table of configurations
  at_edges = []
  for algorithm, by_config in curves.items():
    best, complete = _select(spec, by_config, seeds, rounds)
    runs = by_config[best]
    label = reproductions.describe(spec, algorithm, best)
    cells = [_cell(runs, m, c, seeds) for m in reported for c in checkpoints]
    if reach:
      cells.append(_reached(runs, spec, seeds))
    lines.append(f'| {algorithm} | {label} | ' + ' | '.join(cells) + ' |')
    if edges := grid_edges(spec, algorithm, best):
      at_edges.append(f'{algorithm}: {", ".join(edges)}')
    for config, config_runs in by_config.items():
      score = (
        f'{_score(config_runs, select):.4g}'
        if config in complete
        else _cell(config_runs, select, rounds, seeds)
      )
      every.append(
        f'| {algorithm} | {reproductions.describe(spec, algorithm, config)} |'
        f' {score} | {_cell(config_runs, spec.metric, rounds, seeds)} |'
        + (' **selected** |' if config == best else ' |')
      )
    sources = spec.metric_sources.get(algorithm, {})
    for metric in plotted:
      common = sorted(set.intersection(*(set(r[metric]) for r in runs)))
      values = np.array([[r[metric][x] for x in common] for r in runs])
      source = f' [{sources[metric]}]' if metric in sources else ''
      curve_label = f'{algorithm}{source} ({label})'
      band = (values.min(0), values.max(0)) if seeds > 1 else (None, None)
      by_rounds[metric].append(figures.Curve(curve_label, np.array(common), values.mean(0), *band))
      if spec.x_axis:
        x, by_seed = _against(runs, metric, spec.x_axis)
        band = (by_seed.min(0), by_seed.max(0)) if seeds > 1 else (None, None)
        by_x[metric].append(figures.Curve(curve_label, x, by_seed.mean(0), *band))
  if at_edges:
    lines += [
      '',
      'Selected at the edge of its grid (a wider grid might find better): '
      + '; '.join(at_edges)
      + '.',
    ]
  lines += ['', '## Grids', '']
  lines += [
    f'- {algorithm} ({sizes[algorithm]}): '
    + '; '.join(
      f'{reproductions.SHORT_NAMES.get(axis, axis)} in {{{", ".join(f"{v:g}" for v in values)}}}'
      for axis, values in reproductions.axes(spec, algorithm).items()
    )
    for algorithm in curves
  ]
  lines += [
    '',
    '## Every configuration',
    '',
    f'Selection score: mean over seeds of `{select}` averaged over all'
    f' evaluations; `{spec.metric}` at round {rounds}.',
    '',
    f'| algorithm | configuration | score | {spec.metric} @ {rounds} | |',
    '|---|---|---|---|---|',
    *every,
  ]
  panels = [figures.Panel('round', m, by_rounds[m]) for m in plotted]
  if spec.x_axis:
    panels += [figures.Panel(spec.x_axis, m, by_x[m]) for m in plotted]
  figures.draw(
    panels,
    root / name,
    f'{name} ({spec.task})',
    per_row=len(plotted),
    band=f'shaded: lowest to highest of {seeds} seeds; line: their mean',
  )
  table = '\n'.join(lines) + '\n'
  (root / 'results.md').write_text(table)
  return table


def earlier_record(path: pathlib.Path) -> tuple[str, str] | None:
  """(command, timing line or '') of an earlier results.md, if there is one."""
  if not path.exists():
    return None
  lines = path.read_text().splitlines()
  commands = [line[len('Command: `') : -1] for line in lines if line.startswith('Command: `')]
  took = next((line for line in lines if line.startswith('Took ')), '')
  return (commands[0], took.split(' Tables and plot rewritten')[0]) if commands else None
