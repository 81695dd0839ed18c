"""figures.py, the plots of compare.py and reproduce.py: labels from the metrics' names,
each axis fitted to what it draws (bands included, early rounds kept), a log axis with
several labels where a curve spans decades, one legend, three formats."""

import numpy as np
import pytest

from tff_comp.binaries import figures


@pytest.mark.parametrize(
  'column, says',
  [
    ('eval/test_accuracy', 'Test accuracy'),
    ('time/simulated_seconds', 'Simulated time (s)'),
    ('eval/f1', 'F1'),
    ('train/aggregator/mean/clipped_count', 'Clipped count'),
    ('round', 'Round'),
    ('eval/seconds', 'Evaluation time (s)'),
    ('train/async/staleness_max', 'Staleness max'),
    ('train/client_work/local_seconds', 'Local time (s)'),  # the unit of any *_seconds
  ],
)
def test_axis_labels_come_from_the_metrics_names(column, says):
  assert figures.label(column) == says


BAND = 'shaded: lowest to highest of 3 seeds'


def _panels():
  rounds = np.arange(0, 101, 10.0)
  loss = 500.0 * 0.9**rounds + 0.5  # from 500 to ~0.5: three decades
  accuracy = np.linspace(0.04, 0.9, len(rounds))  # 22x: a share stays linear
  return [
    figures.Panel(
      'round',
      'eval/test_loss',
      [
        figures.Curve('A', rounds, loss, loss * 0.8, loss * 1.3),
        figures.Curve('B', rounds[:6], 2 * loss[:6]),  # stops at round 50
      ],
    ),
    figures.Panel(
      'time/simulated_seconds',
      'eval/test_accuracy',
      [figures.Curve('A', 6.0 * rounds, accuracy), figures.Curve('B', 6.0 * rounds, accuracy / 2)],
    ),
  ]


def test_each_axis_fits_what_it_draws_and_the_legend_is_said_once():
  fig = figures.figure(_panels(), 'a title', band=BAND)
  try:
    loss_ax, accuracy_ax = fig.axes
    # The loss panel: log, every value (bands and round 0 included) inside, labels at
    # 1-2-5 steps across the decades.
    assert loss_ax.get_yscale() == 'log'
    low, high = loss_ax.get_ylim()
    assert low < 0.5 * 0.8 and high > 2 * 500.5 and high < 3 * 500.5
    shown = [t for t in loss_ax.get_yticks() if low <= t <= high]
    assert len(shown) >= 6
    assert loss_ax.get_xlim() == (0.0, 100.0)
    # The accuracy panel: linear, fitted to 0.02-0.9 (not 0-1), x to the clock's end.
    assert accuracy_ax.get_yscale() == 'linear'
    low, high = accuracy_ax.get_ylim()
    assert -0.03 < low < 0.02 and 0.9 < high < 0.95
    assert accuracy_ax.get_xlim() == (0.0, 600.0)
    assert accuracy_ax.get_xlabel() == 'Simulated time (s)'
    assert accuracy_ax.get_ylabel() == 'Test accuracy'
    # One legend for the figure, each run once, then what the band is; none on the
    # panels; a one-line title.
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ['A', 'B', BAND]
    assert all(ax.get_legend() is None for ax in fig.axes)
    assert fig._suptitle.get_text() == 'a title'
    # A label keeps its colour in every panel.
    colors = [[line.get_color() for line in ax.get_lines()] for ax in fig.axes]
    assert colors[0] == colors[1] and colors[0][0] != colors[0][1]
    # and its line style: B drawn over an equal A leaves A's line showing between dashes.
    dashes = [[line.get_linestyle() for line in ax.get_lines()] for ax in fig.axes]
    assert dashes[0] == dashes[1] and dashes[0][0] != dashes[0][1]
  finally:
    figures.plt.close(fig)


def test_a_figure_is_written_as_png_pdf_and_svg(tmp_path):
  paths = figures.draw(_panels(), tmp_path / 'out' / 'fig', band=BAND)
  assert [p.name for p in paths] == ['fig.png', 'fig.pdf', 'fig.svg']
  assert all(p.stat().st_size > 1000 for p in paths)
  assert paths[0].read_bytes()[:4] == b'\x89PNG' and paths[1].read_bytes()[:4] == b'%PDF'


def test_a_band_is_explained_or_refused():
  """A shaded band nobody explained reads as anything (the issue: 'the band
  unexplained'); the figure says what it is, or is not drawn."""
  with pytest.raises(ValueError, match='say what it is'):
    figures.figure(_panels())


def test_panels_along_the_same_column_share_its_range():
  """A training metric (from round 1) beside an evaluation one (from round 0) started
  at different places, side by side."""
  rounds = np.arange(0, 11.0)
  fig = figures.figure(
    [
      figures.Panel('round', 'eval/test_loss', [figures.Curve('A', rounds, 1 / (1 + rounds))]),
      figures.Panel(
        'round', 'train/client_work/train_loss', [figures.Curve('A', rounds[1:], 1 / rounds[1:])]
      ),
    ]
  )
  try:
    assert [ax.get_xlim() for ax in fig.axes] == [(0.0, 10.0), (0.0, 10.0)]
  finally:
    figures.plt.close(fig)


def _settling(ends):
  """Curves falling from 4 to each of `ends` (an objective from its round-0 value)."""
  x = np.arange(0, 101, 5.0)
  return [figures.Curve(f'r{e}', x, e + (4.0 - e) * np.exp(-x / 12)) for e in ends]


@pytest.mark.parametrize(
  'curves, zoomed',
  [
    (_settling([0.50, 0.52, 0.56]), True),  # 0.06 apart on an axis of 3.5
    (_settling([0.5, 2.5]), False),  # apart on the axis already
    (_settling([0.52]), False),  # one curve: no differences to show
    (_settling([0.001, 0.0012]), False),  # spans decades: a log axis shows them
  ],
)
def test_late_differences_an_early_value_squeezes_get_an_inset(curves, zoomed):
  fig = figures.figure([figures.Panel('round', 'eval/train_loss', curves)])
  try:
    (ax,) = fig.axes
    assert len(ax.child_axes) == int(zoomed)
    if zoomed:
      (inset,) = ax.child_axes
      assert inset.get_xlim() == (50.0, 100.0)  # the second half
      ends = [c.y[-1] for c in curves]
      starts = [c.y[c.x >= 50][0] for c in curves]
      low, high = inset.get_ylim()
      assert low < min(ends) and high > max(starts)
      assert high - low < 0.2  # the differences fill it
      assert len(inset.get_lines()) == len(curves)
      # Above the middle, where the settled curves leave the panel free.
      fig.canvas.draw()
      box, whole = inset.get_window_extent(), ax.get_window_extent()
      assert box.y0 + box.y1 > whole.y0 + whole.y1
  finally:
    figures.plt.close(fig)
