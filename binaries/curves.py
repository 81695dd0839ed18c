"""A run's metrics.csv read as curves, without TensorFlow (`compare.py` starts in a
second): what the grids (`grid.py`) and the comparisons (`compare.py`) read."""

import csv
import pathlib

# metrics.csv's columns of no group (docs/metrics.md).
_UNGROUPED = ('round', 'seconds', 'seconds_per_round')


def column(metric: str) -> str:
  """A metric's metrics.csv column: evaluation metrics by name, others by full path
  (e.g. 'train/client_work/train_loss') or as they are ('seconds')."""
  return metric if '/' in metric or metric in _UNGROUPED else f'eval/{metric}'


def read_curves(path: pathlib.Path, metrics, sources=None) -> dict[str, dict[int, float]]:
  """{metric: {round: value}} from the metrics.csv in `path` (rows that have the
  metric), reading metric m from column `sources[m]` when given; and {'round': {r: r}}
  for every row written (a run stopped between evaluations ends after its last row)."""
  with open(path / 'metrics.csv', newline='') as f:
    rows = list(csv.DictReader(f))
  sources = sources or {}
  named = {m: column(sources.get(m, m)) for m in metrics}
  curves = {
    m: {int(r['round']): float(r[named[m]]) for r in rows if r.get(named[m])} for m in metrics
  }
  curves['round'] = {int(r['round']): float(r['round']) for r in rows}
  return curves


def header(path: pathlib.Path) -> list[str]:
  """The columns of the metrics.csv in `path`."""
  with open(path / 'metrics.csv', newline='') as f:
    return next(csv.reader(f), [])
