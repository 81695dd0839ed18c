"""The run directory's files besides checkpoints: metrics.csv and TensorBoard events
(`MetricsWriter`, buffered off the round's path), whole-file writes by temp file and
rename, the final model, and the lock that keeps two runs out of one directory.

One merged train/eval row per round (TFF's release managers write one value tree per
call) is simpler to read, to plot and to cut back on resume.
"""

from collections.abc import Mapping
import contextlib
import csv
import fcntl
import functools
import io
import os
import pathlib
import shutil
import signal
import socket
import tempfile
import threading
import time
from typing import Any

import numpy as np
from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, types_pb2
from tensorboard.plugins.scalar import metadata as scalar_metadata
import tensorflow as tf

Metrics = dict[str, float]


def flatten_metrics(tree: Any, prefix: str = '') -> Metrics:
  """Nested OrderedDicts of scalars -> {'a/b/c': float}; empty leaves dropped."""
  flat = {}
  if isinstance(tree, Mapping):
    for key, value in tree.items():
      flat.update(flatten_metrics(value, f'{prefix}{key}/'))
  elif not isinstance(tree, (tuple, list)):
    flat[prefix.rstrip('/')] = float(np.asarray(tree))
  return flat


# What `tf.summary.scalar` marks its summaries with, so TensorBoard plots them as scalars.
_SCALAR_METADATA = scalar_metadata.create_summary_metadata(display_name=None, description=None)


@functools.lru_cache(maxsize=4096)
def _scalar_value(tag: str) -> summary_pb2.Summary.Value:
  """A scalar's summary value without its number, as `tf.summary.scalar` writes it (a
  float32 tensor marked as a scalar); copied for each round (never changed)."""
  return summary_pb2.Summary.Value(
    tag=tag, metadata=_SCALAR_METADATA, tensor=tensor_pb2.TensorProto(dtype=types_pb2.DT_FLOAT)
  )


def _scalar_event(step: int, metrics: Metrics) -> event_pb2.Event:
  """An event of one round's metrics, each value as `tf.summary.scalar` writes it. Built
  in Python from a value per tag made once: 20 eager `tf.summary.scalar` calls cost
  hundreds of times as much, building each value anew twice as much as copying made
  ones."""
  event = event_pb2.Event(wall_time=time.time(), step=step)
  for tag, value in metrics.items():
    made = event.summary.value.add()
    made.CopyFrom(_scalar_value(tag))
    made.tensor.float_val.append(value)
  return event


class _EventFile:
  """A TensorBoard event file in `directory`, named and begun as TensorBoard's
  `EventFileWriter` does, written in the calling thread by TensorFlow's record writer
  (event files are TFRecord files): TensorBoard's own writer computes each record's
  CRC32C in Python (tens of times slower than TensorFlow's for a round's scalars), and
  its
  `EventFileWriter`'s thread printed a traceback of its own when the disk filled,
  besides the run's one line. Write errors raise OSError."""

  def __init__(self, directory: pathlib.Path):
    directory.mkdir(parents=True, exist_ok=True)
    name = f'events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}'
    with _as_os_error():
      self._records = tf.io.TFRecordWriter(str(directory / name))
    self.write(event_pb2.Event(wall_time=time.time(), file_version='brain.Event:2'))

  def write(self, event: event_pb2.Event) -> None:
    with _as_os_error():
      self._records.write(event.SerializeToString())

  def flush(self) -> None:
    with _as_os_error():
      self._records.flush()

  def close(self) -> None:
    with _as_os_error():
      self._records.close()


@contextlib.contextmanager
def _as_os_error():
  """TensorFlow's file errors (a full disk: 'No space left on device') as OSError."""
  try:
    yield
  except tf.errors.OpError as e:
    raise OSError(e.message) from e


@contextlib.contextmanager
def _signals_held():
  """Holds SIGINT and SIGTERM back while the context runs (in the main thread, where
  Python runs signal handlers; elsewhere it does nothing): one that arrives is noted
  and raised again, to its own handler, at the end. (Blocking them with
  `pthread_sigmask` lost them: threads TensorFlow started meanwhile kept the mask.)"""
  held = (signal.SIGINT, signal.SIGTERM)
  # A handler installed outside Python reads as None and could not be put back.
  if threading.current_thread() is not threading.main_thread() or any(
    signal.getsignal(s) is None for s in held
  ):
    yield
    return
  arrived = []
  handlers = {s: signal.signal(s, lambda signum, _: arrived.append(signum)) for s in held}
  try:
    yield
  finally:
    for s, handler in handlers.items():
      signal.signal(s, handler)
    for s in arrived:
      signal.raise_signal(s)


class MetricsWriter:
  """Writes per-round metrics to CSV and TensorBoard in `output_dir`, off the round's
  path: the first trained round's row at once (a run shows it has started training),
  then rows buffered and written together every `flush_seconds`, by `flush()` (the
  checkpointer calls it before it saves, so every row up to a checkpoint is on disk
  before the checkpoint is) and by `close()`. TensorBoard's events are written by
  TensorFlow's record writer in this thread (`_EventFile`), each round's scalars as
  `tf.summary.scalar` writes them (one eager `tf.summary.scalar` per metric cost more
  than a small model's round; a `tf.function` writing them was traced for every run,
  more in a grid whose trials' threads contend: docs/speed.md).

  `kept_rows`: rows of an interrupted run to keep (a resumed run continues after
  them); the CSV and the TensorBoard events are rewritten from them, so neither holds
  a round twice nor a round the resumed run will redo.
  """

  def __init__(
    self,
    output_dir: pathlib.Path,
    columns: list[str],
    kept_rows: list[dict[str, str]] | None = None,
    flush_seconds: float = 2.0,
  ):
    self._columns = ['round', 'seconds'] + columns
    self._flush_seconds, self._flushed = flush_seconds, time.monotonic()
    self._first_trained = True
    # The kept rows go to a new file renamed over the old one: a kill while writing
    # leaves the old file whole, never a shortened one.
    path, kept = output_dir / 'metrics.csv', io.StringIO()
    writer = csv.DictWriter(kept, self._columns, restval='')
    writer.writeheader()
    writer.writerows(kept_rows or [])
    write_whole(path, kept.getvalue())
    self._file = open(path, 'a', newline='')
    self._buffer = io.StringIO()
    self._csv = csv.DictWriter(self._buffer, self._columns, restval='')
    shutil.rmtree(output_dir / 'tensorboard', ignore_errors=True)
    self._tb = _EventFile(output_dir / 'tensorboard')
    self._tb_rows: list[tuple[int, Metrics]] = [
      (
        int(row['round']),
        {k: float(v) for k, v in row.items() if k not in ('round', 'seconds') and v},
      )
      for row in kept_rows or []
    ]
    self.flush()

  def write(self, round_num: int, seconds: float, metrics: Metrics) -> None:
    self._csv.writerow(
      {
        'round': round_num,
        'seconds': f'{seconds:.4f}',
        **{k: v for k, v in metrics.items() if k in self._columns},
      }
    )
    self._tb_rows.append((round_num, dict(metrics)))
    if self._first_trained and round_num > 0:
      self._first_trained = False
      self.flush()
    elif time.monotonic() - self._flushed >= self._flush_seconds:
      self.flush()

  def flush(self) -> None:
    """Writes the buffered rows to metrics.csv and TensorBoard's event file, whole: a
    Ctrl-C or SIGTERM arriving meanwhile takes effect when they are written (one
    raised in the middle made the closing flush write some rows twice)."""
    with _signals_held():
      self._write_buffered()

  def _write_buffered(self) -> None:
    self._file.write(self._buffer.getvalue())
    self._file.flush()
    self._buffer.seek(0)
    self._buffer.truncate()
    for round_num, metrics in self._tb_rows:
      self._tb.write(_scalar_event(round_num, metrics))
    self._tb_rows.clear()
    self._tb.flush()
    self._flushed = time.monotonic()

  def close(self) -> None:
    self.flush()
    self._file.close()
    self._tb.close()


# Prefixes of `write_whole`'s temporary files (a killed run may leave one behind).
TEMPORARY_PREFIXES = ('.metrics.csv.', '.config.json.')


def write_whole(path: pathlib.Path, text: str) -> None:
  """Writes `text` to `path` through a temporary file in the same directory, synced and
  renamed over it: a kill leaves the old file or the new one, never a part of one."""
  with tempfile.NamedTemporaryFile(
    'w', newline='', dir=path.parent, delete=False, prefix=f'.{path.name}.'
  ) as new:
    new.write(text)
    new.flush()
    os.fsync(new.fileno())
    # A temporary file is private (0600); the run's files get the mode `open` gives,
    # as the directory's other files (0644 under the usual umask).
    os.chmod(new.fileno(), 0o666 & ~_UMASK)
  os.replace(new.name, path)


def _read_umask() -> int:
  current = os.umask(0)  # the only way to read it; set back at once, at import (before
  os.umask(current)  # the run's threads, which would create files meanwhile)
  return current


_UMASK = _read_umask()


def write_client_rows(path: pathlib.Path, rows: list[dict[str, Any]]) -> None:
  """One evaluation's per-client rows as a CSV: `client`, then the metrics."""
  path.parent.mkdir(parents=True, exist_ok=True)
  columns = ['client'] + sorted({k for row in rows for k in row} - {'client'})
  with open(path, 'w', newline='') as f:
    writer = csv.DictWriter(f, columns, restval='')
    writer.writeheader()
    writer.writerows(rows)


def whole_rows(path: pathlib.Path) -> tuple[list[str], list[dict[str, str]], str]:
  """(metric columns, the rows of rounds 0, 1, 2, ... as long as each is whole, what
  ends them: '' at the file's end, else the first missing or damaged row). A row is
  whole when it has every column, its round and seconds are numbers, and its bytes
  decode (garbled ones read as U+FFFD)."""
  with open(path, newline='', errors='replace') as f:
    reader = csv.DictReader(f)
    fields = reader.fieldnames or []
    columns = [c for c in fields if c not in ('round', 'seconds')]
    if 'round' not in fields or 'seconds' not in fields or any('\ufffd' in c for c in fields):
      return columns, [], 'its header is missing or damaged'
    rows: list[dict[str, str]] = []
    for row in reader:
      expected = len(rows)
      number = row.get('round') or ''
      if number.isdigit() and int(number) > expected:
        return columns, rows, f'no row for round {expected}'
      whole = (
        None not in row
        and None not in row.values()
        and number == str(expected)
        and not any('\ufffd' in value for value in row.values())
      )
      try:
        float(row['seconds'] or 'nan')
      except (TypeError, ValueError):
        whole = False
      if not whole:
        return columns, rows, (f'the row of round {expected} (line {reader.line_num}) is damaged')
      rows.append(row)
    return columns, rows, ''


def save_model(path: pathlib.Path, weights) -> None:
  """Writes ModelWeights to an .npz with one array per weight, named by its place:
  `trainable_<i>` and `non_trainable_<i>` (`load_model` reads it back)."""
  arrays = {
    f'{part}_{i}': np.asarray(w)
    for part in ('trainable', 'non_trainable')
    for i, w in enumerate(getattr(weights, part))
  }
  np.savez(path, **arrays)


def load_model(path: str | os.PathLike) -> Any:
  """The `tff.learning.models.ModelWeights` (tuples of NumPy arrays) in `save_model`'s
  file, e.g. a run's final_model.npz."""
  import tensorflow_federated as tff

  with np.load(path) as saved:

    def part(name):
      count = sum(
        key.startswith(f'{name}_') and key[len(name) + 1 :].isdigit() for key in saved.files
      )
      return tuple(saved[f'{name}_{i}'] for i in range(count))

    return tff.learning.models.ModelWeights(part('trainable'), part('non_trainable'))


class OutputDirInUse(RuntimeError):
  """The output directory cannot be locked: another process runs there (the message
  names its pid), or it or its lock file cannot be created or opened."""


@contextlib.contextmanager
def output_lock(output_dir: pathlib.Path):
  """Holds an advisory lock on `output_dir/.lock` (holding this process's pid) while the
  context runs, so two runs or resumes never write one directory; raises OutputDirInUse
  when another process holds it. The OS releases it when the holder dies."""
  try:
    # The checks before (`run_directory.check_output_dir`) cannot foresee every refusal:
    # root passes os.access under /proc, a disk fills, a mount turns read-only.
    output_dir.mkdir(parents=True, exist_ok=True)
  except OSError as e:
    raise OutputDirInUse(f'--output_dir={output_dir} cannot be created ({e.strerror}).') from None
  try:
    lock = open(output_dir / '.lock', 'a+')
  except OSError as e:  # a directory, or unreadable, in its place
    raise OutputDirInUse(
      f'--output_dir={output_dir}: its lock file {output_dir / ".lock"}'
      f' cannot be opened ({e.strerror}); remove it if no run uses the'
      ' directory.'
    ) from None
  try:
    try:
      fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      lock.seek(0)
      holder = lock.read().strip() or 'unknown'
      raise OutputDirInUse(
        f'--output_dir={output_dir} is in use by another run (pid'
        f' {holder}); wait for it to end or choose another'
        ' directory.'
      ) from None
    lock.seek(0)
    lock.truncate()
    lock.write(str(os.getpid()))
    lock.flush()
    yield
  finally:
    lock.close()  # releases the lock
