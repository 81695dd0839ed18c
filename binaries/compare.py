r"""Compares runs: a table of their metrics at chosen rounds (or times) and figures of
their curves, from the runs' own metrics.csv.

    python binaries/compare.py runs/fedavg-lasso runs/feddualavg-lasso
    python binaries/compare.py runs/a runs/b --metrics=f1,train_loss --at=50,100 \
        --labels=FedAvg,FedDualAvg --output=figures/lasso
    python binaries/compare.py runs/async runs/sync --x=time/simulated_seconds

A metric is an evaluation metric by its name (`f1`: column `eval/f1`) or any column by
its full name (`train/client_work/train_loss`, docs/metrics.md). A table cell is the
metric's value at the last row at or before the `--at` value of the `--x` column (the
row named beside the value when it is an earlier one). Writes `--output`.md (the table,
printed too) and `--output`.png, .pdf and .svg (`figures.py`). Bad input exits with
status 2 and one line. Needs no TensorFlow.
"""

import csv
import json
import math
import pathlib
import sys
from typing import Any

from absl import app, flags

from tff_comp.binaries import closed_stdout, curves, figures, flag_check
from tff_comp.binaries.flag_check import fail

_METRICS = flags.DEFINE_list(
  'metrics',
  None,
  'Metrics to compare (default: every evaluation metric all the runs have).',
)
_X = flags.DEFINE_string(
  'x', 'round', 'The column the curves run along: round, seconds, time/simulated_seconds.'
)
_AT = flags.DEFINE_list(
  'at', None, 'Values of --x at which the table reads the metrics (default: the last all reached).'
)
_LABELS = flags.DEFINE_list(
  'labels',
  None,
  "The runs' names (default: the settings in which their config.json differ, at most"
  " three, else their directories').",
)
_OUTPUT = flags.DEFINE_string(
  'output', 'runs/compare', 'Path and stem of the table and figures (under runs/, ignored by git).'
)
_TITLE = flags.DEFINE_string(
  'title', None, "The figure's title (default: the runs' task when they share one)."
)
# config.json's entries that say where and how a run was written or ran, not what it is.
_NOT_SETTINGS = frozenset(
  {
    'output_dir',
    'overwrite',
    'resume',
    'force_resume',
    'environment',
    'runtime_record',
    'runtime',
    'runtime_options',
    'checkpoints',
  }
)
_MOST_SETTINGS_NAMED = 3


def _settings(run: pathlib.Path) -> dict[str, str]:
  """The run's settings from its config.json, flattened to {dotted path: value}, each
  overlaid by the value the run resolved (its task's defaults) of the same name; {}
  without a readable config.json."""
  try:
    config = json.loads((run / 'config.json').read_text())
  except (OSError, ValueError):
    return {}
  if not isinstance(config, dict):
    return {}

  def flat(tree: Any, path: str = '') -> dict[str, str]:
    if isinstance(tree, dict):
      return {
        leaf: value
        for key, inner in tree.items()
        if key not in _NOT_SETTINGS
        for leaf, value in flat(inner, f'{path}.{key}' if path else str(key)).items()
      }
    return {path: tree if isinstance(tree, str) else json.dumps(tree)}

  settings = flat({k: v for k, v in config.items() if k != 'resolved'})
  resolved = config.get('resolved')
  # The client/server hyperparameters it resolved repeat settings under other names.
  for path, value in flat(resolved if isinstance(resolved, dict) else {}).items():
    if path.split('.')[0] in ('client_hparams', 'server_hparams'):
      continue
    named = [p for p in settings if p.split('.')[-1] == path.split('.')[-1]]
    settings.update(dict.fromkeys(named or [path], value))
  return settings


def _labels(runs: list[pathlib.Path], settings: list[dict[str, str]]) -> list[str]:
  """The runs' names: `--labels`, else the settings their config.json differ in
  (`_label`; at most three), else their directories' (with the parent's where two
  share a name)."""
  if _LABELS.value:
    if len(_LABELS.value) != len(runs):
      fail(f'--labels names {len(_LABELS.value)} runs; {len(runs)} are given.')
    return list(_LABELS.value)
  # A setting only some runs have is their algorithm's own (FedProx's mu): not named.
  shared = [p for p in settings[0] if all(p in s for s in settings)]
  differ = [p for p in shared if len({s[p] for s in settings}) > 1]
  if len(runs) > 1 and all(settings) and 0 < len(differ) <= _MOST_SETTINGS_NAMED:
    labels = [_label(s, differ) for s in settings]
    if len(set(labels)) == len(labels):
      return labels
  names = [r.name for r in runs]
  return [f'{r.parent.name}/{r.name}' if names.count(r.name) > 1 else r.name for r in runs]


def _label(settings: dict[str, str], differ: list[str]) -> str:
  """A run named by its `differ` settings: the algorithm by its name, others as
  name=value; a setting it does not have (null: FedAvg's regularizer beside FedDualAvg's
  l1) left out, unless nothing else would name it (then name=none)."""
  named = [(p.split('.')[-1], settings[p]) for p in differ]
  parts = [v if n == 'algorithm' else f'{n}={v}' for n, v in named if v != 'null']
  return ', '.join(parts or [f'{n}=none' for n, _ in named])


def _headers(runs: list[pathlib.Path]) -> dict[pathlib.Path, list[str]]:
  """Each run's metrics.csv columns, the file checked readable as text with rows and
  the `--x` column."""
  headers = {}
  for run in runs:
    try:
      headers[run] = curves.header(run)
      with open(run / 'metrics.csv', newline='') as f:
        has_rows = sum(1 for _ in csv.reader(f)) > 1
    except (OSError, UnicodeDecodeError, csv.Error) as e:
      fail(f'{run}/metrics.csv cannot be read as a CSV file ({e}).')
    if not has_rows:
      fail(f'{run}/metrics.csv has no rows yet: the run has written no round.')
    if curves.column(_X.value) not in headers[run]:
      fail(
        f'--x={_X.value} is no column of {run}/metrics.csv (round, seconds or a column'
        ' of time/, docs/metrics.md).'
      )
  return headers


def _read(run: pathlib.Path, metrics: list[str]) -> dict[str, dict[int, float]]:
  """The run's curves of `metrics` and `--x`; a value or round that is no number is
  one line."""
  try:
    return curves.read_curves(run, [*metrics, _X.value], {_X.value: _X.value})
  except (ValueError, TypeError) as e:
    fail(f'{run}/metrics.csv holds a value that is no number ({e}).')
  return {}


def _metrics(runs: list[pathlib.Path]) -> list[str]:
  """`--metrics` as columns, each checked in every run; by default the evaluation
  columns (but its seconds) every run has."""
  headers = _headers(runs)
  if not _METRICS.value:
    common = [
      c
      for c in headers[runs[0]]
      if c.startswith('eval/') and c != 'eval/seconds' and all(c in h for h in headers.values())
    ]
    if not common:
      fail('the runs have no evaluation metric in common; name some with --metrics.')
    return common
  for metric in [*_METRICS.value, _X.value]:
    for run, header in headers.items():
      if curves.column(metric) not in header:
        fail(
          f'{run}/metrics.csv has no column {curves.column(metric)} (its evaluation'
          f' columns: {", ".join(c for c in header if c.startswith("eval/")) or "none"}).'
        )
  return [curves.column(m) for m in _METRICS.value]


def _along(curve: dict[int, float], x: dict[int, float]) -> list[tuple[float, float, int]]:
  """(x, value, round) of each round that has both, in order of rounds."""
  return [(x[r], v, r) for r, v in sorted(curve.items()) if r in x]


def _cell(points: list[tuple[float, float, int]], at: float) -> str:
  before = [p for p in points if p[0] <= at]
  if not before:
    return '—'
  x, value, round_num = before[-1]
  return f'{value:.4g}' if x == at else f'{value:.4g} (round {round_num})'


@closed_stdout.closing_stdout_quietly
def main(argv: list[str]) -> None:
  runs = [pathlib.Path(a) for a in argv[1:]]
  if not runs:
    fail('give the run directories to compare (each holding a metrics.csv).')
  for run in runs:
    if not (run / 'metrics.csv').is_file():
      fail(f'{run} holds no metrics.csv: not a run directory.')
  metrics = _metrics(runs)
  settings = [_settings(r) for r in runs]  # each config.json read once
  labels = _labels(runs, settings)
  try:
    given = [float(v) for v in _AT.value or ()]
  except ValueError:
    given = [math.nan]
  if not all(math.isfinite(v) for v in given):
    fail(f'--at takes finite numbers of --x={_X.value}, not {",".join(_AT.value)}.')
  read = {run: _read(run, metrics) for run in runs}
  stem = pathlib.Path(_OUTPUT.value)
  try:
    stem.parent.mkdir(parents=True, exist_ok=True)
  except OSError as e:
    fail(f'--output={_OUTPUT.value}: its folder cannot be made ({e.strerror}).')
  # On a time axis a run starts at round 0, time 0 (its first row is round 1's).
  x_of = {
    run: ({0: 0.0} | c[_X.value]) if _X.value != 'round' else c['round'] for run, c in read.items()
  }
  points = {run: {m: _along(read[run][m], x_of[run]) for m in metrics} for run in runs}
  # By default the last value of --x every run reached.
  at = given or [min(max(x.values()) for x in x_of.values())]
  x_name = 'round' if _X.value == 'round' else figures.label(_X.value).lower()
  lines = [
    '| run | '
    + ' | '.join(f'{figures.label(m)} @ {x_name} {a:g}' for m in metrics for a in at)
    + ' |',
    '|---|' + '---|' * (len(metrics) * len(at)),
  ]
  for run, name in zip(runs, labels):
    lines.append(
      f'| {name} | ' + ' | '.join(_cell(points[run][m], a) for m in metrics for a in at) + ' |'
    )
  table = '\n'.join(lines) + '\n'
  panels = [
    figures.Panel(
      _X.value,
      m,
      [
        figures.Curve(name, [p[0] for p in points[run][m]], [p[1] for p in points[run][m]])
        for run, name in zip(runs, labels)
        if points[run][m]
      ],
    )
    for m in metrics
  ]
  written = figures.draw(panels, stem, _title(settings))
  (stem.parent / f'{stem.name}.md').write_text(table)
  print(table)
  print(f'wrote {stem.parent / f"{stem.name}.md"}, ' + ', '.join(str(p) for p in written))


def _title(settings: list[dict[str, str]]) -> str:
  """`--title`, else the runs' task (from their `_settings`) when they share one."""
  if _TITLE.value is not None:
    return _TITLE.value
  tasks = {s.get('task', '') for s in settings}
  return tasks.pop() if len(tasks) == 1 else ''


def _parse(argv: list[str]) -> list[str]:
  """absl's parser with bad flags as one line and exit 2 (not its usage text), and its
  help with exit status 0 (absl's help flags exit 1), as run.py's."""
  if flag_check.asks_help(argv):
    app.usage(shorthelp=not any(a.startswith('--helpfull') for a in argv), writeto_stdout=True)
    sys.exit(0)
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    fail(e)
  return []


if __name__ == '__main__':
  sys.exit(app.run(main, flags_parser=_parse))
