"""A grid's progress while its units run: each unit's rounds so far, said in one line
every so often. A unit in another process or on a Ray worker prints nothing until it
ends (a batched group says one line at its start and one at its end), so the driver
reads the rounds from the units' own metrics.csv files, which every run writes as it
goes and which a grid's processes and hosts share (`--output_dir`, BUILD_NOTES.md)."""

from collections.abc import Callable, Sequence
import pathlib
import threading
import time

# Bytes read from a metrics.csv's end: more than one row of any task's metrics.
_TAIL_BYTES = 65536


def last_round(metrics_csv: pathlib.Path, since: float | None = None) -> int:
  """The round of a metrics.csv's last row (0 when it has none yet, or no file, or one
  last written before `since`, a time.time())."""
  try:
    if since is not None and metrics_csv.stat().st_mtime < since:
      return 0
    with metrics_csv.open('rb') as f:
      f.seek(0, 2)
      size = f.tell()
      f.seek(max(0, size - _TAIL_BYTES))
      lines = f.read().decode(errors='replace').splitlines()
  except OSError:
    return 0
  for line in reversed(lines):
    first = line.split(',', 1)[0]
    if first.isdigit():
      return int(first)
  return 0


class GridProgress:
  """Says, every `every` seconds until `stop`, how far each unit's runs are: a unit
  (`labels[i]`) trains `runs[i]` (run directories) for `rounds` rounds each.

      grid, 2 min 5 s: fedmid 3,840 of 8,000 rounds; fedmid_osp 3,520 of 8,000; feddualavg done

  `done(i)` marks unit i finished (its runs may stop early: a divergence). `replacing`:
  the runs replace runs already there (`--overwrite`), whose files count only once
  rewritten."""

  def __init__(
    self,
    labels: Sequence[str],
    runs: Sequence[Sequence[pathlib.Path]],
    rounds: int,
    *,
    every: float = 30.0,
    say: Callable[[str], None] = lambda line: print(line, flush=True),
    replacing: bool = False,
  ):
    self._labels, self._runs, self._rounds = list(labels), [list(r) for r in runs], rounds
    self._every, self._say = every, say
    self._finished: set[int] = set()
    self._stopped = threading.Event()
    self._start = time.monotonic()
    self._since = time.time() if replacing else None
    self._thread = threading.Thread(target=self._loop, name='grid-progress', daemon=True)

  def __enter__(self) -> 'GridProgress':
    self._thread.start()
    return self

  def __exit__(self, *exc) -> None:
    self._stopped.set()
    self._thread.join()

  def done(self, unit: int) -> None:
    self._finished.add(unit)

  def line(self) -> str:
    """The progress line of now."""
    minutes, seconds = divmod(round(time.monotonic() - self._start), 60)
    parts = []
    for i, (label, runs) in enumerate(zip(self._labels, self._runs)):
      if i in self._finished:
        parts.append(f'{label} done')
        continue
      total = len(runs) * self._rounds
      so_far = sum(min(last_round(run / 'metrics.csv', self._since), self._rounds) for run in runs)
      parts.append(f'{label} {so_far:,} of {total:,} rounds' if so_far else f'{label} waiting')
    return f'grid, {minutes} min {seconds} s: ' + '; '.join(parts)

  def _loop(self) -> None:
    while not self._stopped.wait(self._every):
      self._say(self.line())
