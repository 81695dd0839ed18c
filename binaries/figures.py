"""Figures for papers from runs' curves, for `reproduce.py`'s grids and `compare.py`'s runs
alike: axis labels from the metrics' names and units (docs/metrics.md), one legend under
the panels, every axis fitted to what it draws, a log axis with a label at 1-2-5 steps
where a curve spans over a decade, an inset of the late rounds where early values squeeze
the curves' differences, and each figure as PNG, PDF and SVG. Notes about the
data (seeds, selection) belong in the text beside the figure, not in its titles.
Needs no TensorFlow."""

from collections.abc import Sequence
import dataclasses
import itertools
import math
import pathlib

import matplotlib

matplotlib.use('Agg')
from matplotlib import ticker
import matplotlib.patches
import matplotlib.pyplot as plt
import numpy as np

FORMATS = ('png', 'pdf', 'svg')
# Columns whose labels the rule below would not write well (docs/metrics.md's meanings).
_LABELS = {
  'round': 'Round',
  'seconds': 'Wall-clock time (s)',
  'seconds_per_round': 'Training time per round (s)',
  'eval/seconds': 'Evaluation time (s)',
  'time/simulated_seconds': 'Simulated time (s)',
  'time/round_seconds': 'Simulated round time (s)',
  'privacy/epsilon': 'Privacy loss ε',
  'comm/upload_bytes': 'Upload per round (bytes)',
  'comm/download_bytes': 'Download per round (bytes)',
  'train/client_work/train_loss': 'Training loss (clients)',
  'train/client_work/num_examples': 'Examples per round',
  'participation/late': 'Late clients',
}
# Words of metric names as papers write them.
_WORDS = {'f1': 'F1', 'mse': 'MSE', 'oov': 'OOV', 'eos': 'EOS', 'num': 'number of'}
# A log axis where a panel's positive values span this factor or more, but for shares
# (accuracy and its kin, between 0 and 1), which read on a linear axis.
_LOG_SPAN = 20.0
_SHARES = ('accuracy', 'precision', 'recall', 'f1', 'density')
# An inset of the second half where the curves' late spread is under this share of a
# linear axis (`_zoom_late`).
_SQUEEZED = 0.15
_MARKERS = 'osD^vP*X'
# Line styles too, so that a curve drawn over an equal one leaves it visible.
_DASHES = ('-', '--', ':', '-.')


def label(column: str) -> str:
  """The axis label of a metrics.csv column: 'eval/test_accuracy' -> 'Test accuracy',
  'time/simulated_seconds' -> 'Simulated time (s)'."""
  if column in _LABELS:
    return _LABELS[column]
  name = column.rsplit('/', 1)[-1]
  unit = ''
  if name.endswith('_seconds'):
    name, unit = name.removesuffix('_seconds') + '_time', ' (s)'
  words = ' '.join(_WORDS.get(w, w) for w in name.split('_'))
  return words[:1].upper() + words[1:] + unit


@dataclasses.dataclass(frozen=True)
class Curve:
  """One line: `y` (a mean, when over seeds) against `x`, with a band from `low` to
  `high` (the seeds' spread) if given."""

  label: str
  x: np.ndarray
  y: np.ndarray
  low: np.ndarray | None = None
  high: np.ndarray | None = None


@dataclasses.dataclass(frozen=True)
class Panel:
  """The curves of metrics.csv column `y` against column `x` (their axis labels)."""

  x: str
  y: str
  curves: Sequence[Curve]


def draw(
  panels: Sequence[Panel],
  stem: pathlib.Path,
  title: str = '',
  per_row: int = 3,
  band: str = '',
) -> list[pathlib.Path]:
  """`figure(panels, title, per_row, band)` written as `stem`.png, .pdf and .svg;
  returns their paths."""
  fig = figure(panels, title, per_row, band)
  stem.parent.mkdir(parents=True, exist_ok=True)
  paths = [stem.with_name(f'{stem.name}.{fmt}') for fmt in FORMATS]
  for path in paths:
    fig.savefig(path, dpi=150, bbox_inches='tight')
  plt.close(fig)
  return paths


def figure(
  panels: Sequence[Panel], title: str = '', per_row: int = 3, band: str = ''
) -> plt.Figure:
  """`panels` (at most `per_row` a row) in one figure. A curve's label has one colour,
  marker and line style in every panel, and the legend lists each label once, under the
  panels, then what the shaded bands are (`band`, required when a curve has one:
  'shaded: lowest to highest of 3 seeds')."""
  banded = any(c.low is not None for p in panels for c in p.curves)
  if banded and not band:
    raise ValueError('a curve has a band: say what it is (band=...), for the legend.')
  rows = math.ceil(len(panels) / per_row)
  across = min(len(panels), per_row)
  fig, axes = plt.subplots(rows, across, figsize=(4.2 * across, 3.3 * rows), squeeze=False)
  labels = list(dict.fromkeys(c.label for p in panels for c in p.curves))
  colors = plt.rcParams['axes.prop_cycle'].by_key()['color']
  style = {
    name: (color, marker, dashes)
    for name, color, marker, dashes in zip(
      labels, itertools.cycle(colors), itertools.cycle(_MARKERS), itertools.cycle(_DASHES)
    )
  }
  handles = {}
  for ax, panel in zip(axes.flat, panels):
    for curve in panel.curves:
      handles.setdefault(curve.label, _plot(ax, curve, style[curve.label]))
    _fit(ax, panel)
    _zoom_late(ax, panel, style)
    ax.set_xlabel(label(panel.x))
    ax.set_ylabel(label(panel.y))
    ax.grid(alpha=0.3, which='major')
  # Panels along the same column start and end alike (an evaluation metric at round 0
  # beside a training one from round 1 read as shifted).
  for x in {panel.x for panel in panels}:
    along = [ax for ax, panel in zip(axes.flat, panels) if panel.x == x]
    ends = [ax.get_xlim() for ax in along]
    for ax in along:
      ax.set_xlim(min(e[0] for e in ends), max(e[1] for e in ends))
  for ax in list(axes.flat)[len(panels) :]:
    ax.set_visible(False)
  if title:
    fig.suptitle(title)
  fig.tight_layout()
  if banded:
    handles[band] = matplotlib.patches.Patch(color='grey', alpha=0.3, linewidth=0)
  fig.legend(
    list(handles.values()),
    list(handles),
    loc='upper center',
    bbox_to_anchor=(0.5, 0.0),
    ncol=min(len(handles), 2 if max(map(len, handles), default=0) > 30 else 4),
    frameon=False,
  )
  return fig


def _plot(ax, curve: Curve, style: tuple[str, str, str], markers: bool = True):
  """`curve` on `ax` in its (colour, marker, line style), its band shaded; its line."""
  color, marker, dashes = style
  (line,) = ax.plot(
    curve.x,
    curve.y,
    color=color,
    marker=marker if markers else None,
    linestyle=dashes,
    markevery=max(1, len(curve.x) // 8),
    markersize=4,
    linewidth=1.5,
  )
  if curve.low is not None and curve.high is not None:
    ax.fill_between(curve.x, curve.low, curve.high, color=color, alpha=0.15, linewidth=0)
  return line


def _values(curve: Curve, keep: np.ndarray | None = None) -> list[float]:
  """The finite values (bands included) of `curve`, where `keep` if given."""
  parts = (curve.y, curve.low, curve.high)
  return [
    v
    for part in parts
    if part is not None
    for v in (np.asarray(part) if keep is None else np.asarray(part)[keep])
    if math.isfinite(v)
  ]


def _zoom_late(ax, panel: Panel, style: dict) -> None:
  """An inset of the panel's second half where its early values squeeze the curves'
  late differences (an objective's round-0 value: their late spread under `_SQUEEZED`
  of a linear axis), in the half of the axes the late curves leave free, its region
  marked on the panel."""
  if len(panel.curves) < 2 or ax.get_yscale() != 'linear':
    return
  xs = [v for c in panel.curves for v in c.x if math.isfinite(v)]
  if not xs:
    return
  start = min(xs) + 0.5 * (max(xs) - min(xs))
  late = [v for c in panel.curves for v in _values(c, np.asarray(c.x) >= start)]
  bottom, top = ax.get_ylim()
  if not late or not 0 < max(late) - min(late) < _SQUEEZED * (top - bottom):
    return
  low, high = min(late), max(late)
  below = (0.5 * (low + high) - bottom) / (top - bottom) < 0.5  # late curves low: inset high
  inset = ax.inset_axes([0.45, 0.47, 0.52, 0.46] if below else [0.45, 0.1, 0.52, 0.46])
  for curve in panel.curves:
    _plot(inset, curve, style[curve.label], markers=False)
  pad = 0.08 * (high - low)
  inset.set_xlim(start, max(xs))
  inset.set_ylim(low - pad, high + pad)
  inset.tick_params(labelsize=7)
  inset.grid(alpha=0.3)
  ax.indicate_inset_zoom(inset, edgecolor='grey')


def _fit(ax, panel: Panel) -> None:
  """Each axis to what the panel draws (bands included), y on a log scale with 1-2-5
  labels where its positive values span `_LOG_SPAN` or more (not `_SHARES`)."""
  xs = [v for c in panel.curves for v in c.x if math.isfinite(v)]
  ys = [v for c in panel.curves for v in _values(c)]
  if xs and min(xs) < max(xs):
    ax.set_xlim(min(xs), max(xs))
  if not ys:
    return
  low, high = min(ys), max(ys)
  share = any(word in panel.y.rsplit('/', 1)[-1] for word in _SHARES)
  if low > 0 and high / low >= _LOG_SPAN and not share:
    ax.set_yscale('log')
    ax.yaxis.set_major_locator(ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f'{v:g}'))
    ax.yaxis.set_minor_formatter(ticker.NullFormatter())
    pad = 0.04 * math.log10(high / low)
    ax.set_ylim(low / 10**pad, high * 10**pad)
  else:
    pad = 0.05 * (high - low) or 0.05 * (abs(high) or 1.0)
    ax.set_ylim(low - pad, high + pad)
