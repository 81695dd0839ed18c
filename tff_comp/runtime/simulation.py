"""The simulation loop: sample clients, run rounds, evaluate, write metrics.

It drives any `runtime.base.Runtime` (`choice.runner_for` builds one).

Metrics go where tools read them: `metrics.csv` (one row per round; evaluation columns
filled every `eval_period` rounds and at round 0) and TensorBoard event files under
`tensorboard/`, buffered off the round's path (`MetricsWriter`). TFF's release managers
write one value tree per call; one merged train/eval row per round is simpler to read,
to plot and to cut back on resume.
"""

from collections.abc import Callable, Mapping, Sequence
import concurrent.futures
import contextlib
import csv
import dataclasses
import fcntl
import io
import json
import math
import pathlib
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from typing import Any, NamedTuple

from absl import logging
import numpy as np
from tensorboard.compat.proto import summary_pb2
from tensorboard.compat.proto import tensor_pb2
from tensorboard.compat.proto import types_pb2
from tensorboard.plugins.scalar import metadata as scalar_metadata
import tensorflow as tf
import tqdm

from tff_comp import settings
from tff_comp.runtime import base

Metrics = dict[str, float]


class DivergenceError(RuntimeError):
  """Training produced a non-finite loss."""


class Interrupted(KeyboardInterrupt):
  """The run stopped on Ctrl-C or SIGTERM; the state of round `saved_round` is saved
  (0: nothing saved), and `--resume` continues from it."""

  def __init__(self, saved_round: int):
    super().__init__(saved_round)
    self.saved_round = saved_round


# Set by SIGTERM (`stop_on_sigterm`); the loop stops at the end of the round it is in.
_SIGTERM_RECEIVED = threading.Event()


def stop_on_sigterm() -> None:
  """SIGTERM (a scheduler's preemption notice) stops a run as Ctrl-C does: the last
  finished round is saved (`Interrupted`). The loop stops when the round it is in has
  finished (raising at once could land inside TensorFlow's C code, which turned the
  interrupt into a TypeError about the eager context, seen once in the tests); a
  second SIGTERM stops at once."""

  def terminate(signum, frame):
    del signum, frame
    if _SIGTERM_RECEIVED.is_set():
      raise KeyboardInterrupt('SIGTERM')
    _SIGTERM_RECEIVED.set()

  signal.signal(signal.SIGTERM, terminate)


class StopTraining(Exception):
  """Raised by a callback's `after_round` to end the run cleanly after that round (an
  early stop): the round's row is kept, the state checkpointed, the model saved."""


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
_SCALAR_METADATA = scalar_metadata.create_summary_metadata(display_name=None,
                                                           description=None)


def _write_events(steps: tf.Tensor, summaries: tf.Tensor) -> None:
  """Writes `summaries[i]` (a serialized Summary) at step `steps[i]` with the default
  summary writer: one event a round. Traced per writer, which the trace captures."""

  def write(i):
    tf.summary.experimental.write_raw_pb(summaries[i], step=steps[i])
    return i + 1

  tf.while_loop(lambda i: i < tf.shape(steps)[0], write, [tf.constant(0)])


def _scalar_summary(metrics: Metrics) -> bytes:
  """A serialized Summary of one round's metrics, each value as `tf.summary.scalar`
  writes it (a float32 tensor marked as a scalar). Built in Python: 20 eager
  `tf.summary.scalar` calls cost about 9 ms, this about 60 us."""
  return summary_pb2.Summary(value=[
      summary_pb2.Summary.Value(tag=tag, metadata=_SCALAR_METADATA, tensor=tensor_pb2.TensorProto(
          dtype=types_pb2.DT_FLOAT, float_val=[value]))
      for tag, value in metrics.items()]).SerializeToString()


@contextlib.contextmanager
def _signals_held():
  """Holds SIGINT and SIGTERM back while the context runs (in the main thread, where
  Python runs signal handlers; elsewhere it does nothing): one that arrives is noted
  and raised again, to its own handler, at the end. (Blocking them with
  `pthread_sigmask` lost them: threads TensorFlow started meanwhile kept the mask.)"""
  held = (signal.SIGINT, signal.SIGTERM)
  # A handler installed outside Python reads as None and could not be put back.
  if (threading.current_thread() is not threading.main_thread()
      or any(signal.getsignal(s) is None for s in held)):
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
  path: rows are buffered and written together every `flush_seconds`, by `flush()` (the
  checkpointer calls it before it saves, so every row up to a checkpoint is on disk
  before the checkpoint is) and by `close()`. TensorBoard's events are written by one
  `tf.function` call per flush, each round's scalars as `tf.summary.scalar` writes
  them (one eager `tf.summary.scalar` per metric cost about 9 ms a round).

  `kept_rows`: rows of an interrupted run to keep (a resumed run continues after
  them); the CSV and the TensorBoard events are rewritten from them, so neither holds
  a round twice nor a round the resumed run will redo.
  """

  def __init__(self, output_dir: pathlib.Path, columns: list[str],
               kept_rows: list[dict[str, str]] | None = None, flush_seconds: float = 2.0):
    self._columns = ['round', 'seconds'] + columns
    self._flush_seconds, self._flushed = flush_seconds, time.monotonic()
    # The kept rows go to a new file renamed over the old one: a kill while writing
    # leaves the old file whole, never a shortened one.
    path, kept = output_dir / 'metrics.csv', io.StringIO()
    writer = csv.DictWriter(kept, self._columns, restval='')
    writer.writeheader()
    writer.writerows(kept_rows or [])
    write_whole(path, kept.getvalue())
    self._file = open(path, 'a', newline='')  # pylint: disable=consider-using-with
    self._buffer = io.StringIO()
    self._csv = csv.DictWriter(self._buffer, self._columns, restval='')
    shutil.rmtree(output_dir / 'tensorboard', ignore_errors=True)
    self._tb = tf.summary.create_file_writer(str(output_dir / 'tensorboard'))
    self._write_events = tf.function(_write_events, autograph=False, input_signature=[
        tf.TensorSpec([None], tf.int64), tf.TensorSpec([None], tf.string)])
    with self._tb.as_default():  # traced now, not in a later round
      self._write_events.get_concrete_function()
    self._tb_rows: list[tuple[int, Metrics]] = [
        (int(row['round']),
         {k: float(v) for k, v in row.items() if k not in ('round', 'seconds') and v})
        for row in kept_rows or []]
    self.flush()

  def write(self, round_num: int, seconds: float, metrics: Metrics) -> None:
    self._csv.writerow(
        {'round': round_num, 'seconds': f'{seconds:.4f}',
         **{k: v for k, v in metrics.items() if k in self._columns}}
    )
    self._tb_rows.append((round_num, dict(metrics)))
    if time.monotonic() - self._flushed >= self._flush_seconds:
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
    if self._tb_rows:
      with self._tb.as_default():
        self._write_events(
            tf.constant([r for r, _ in self._tb_rows], tf.int64),
            tf.constant([_scalar_summary(metrics) for _, metrics in self._tb_rows]))
      self._tb_rows.clear()
    self._tb.flush()
    self._flushed = time.monotonic()

  def close(self) -> None:
    self.flush()
    self._file.close()
    self._tb.close()


# Prefixes of `write_whole`'s temporary files (a killed run may leave one behind).
_TEMPORARY = ('.metrics.csv.', '.config.json.')


def write_whole(path: pathlib.Path, text: str) -> None:
  """Writes `text` to `path` through a temporary file in the same directory, synced and
  renamed over it: a kill leaves the old file or the new one, never a part of one."""
  with tempfile.NamedTemporaryFile('w', newline='', dir=path.parent, delete=False,
                                   prefix=f'.{path.name}.') as new:
    new.write(text)
    new.flush()
    os.fsync(new.fileno())
  os.replace(new.name, path)


def write_client_rows(path: pathlib.Path, rows: list[dict[str, Any]]) -> None:
  """One evaluation's per-client rows as a CSV: `client`, then the metrics."""
  path.parent.mkdir(parents=True, exist_ok=True)
  columns = ['client'] + sorted({k for row in rows for k in row} - {'client'})
  with open(path, 'w', newline='') as f:
    writer = csv.DictWriter(f, columns, restval='')
    writer.writeheader()
    writer.writerows(rows)


def _read_rows(path: pathlib.Path, up_to: int) -> tuple[list[str], list[dict[str, str]]]:
  """(metric columns, rows of rounds <= up_to) of a metrics.csv."""
  with open(path, newline='') as f:
    reader = csv.DictReader(f)
    rows = [r for r in reader if r.get('round', '').isdigit() and int(r['round']) <= up_to]
    return [c for c in reader.fieldnames or [] if c not in ('round', 'seconds')], rows


class Checkpoints:
  """The run's state every few rounds, in `output_dir/checkpoints`: round r's state as
  `state_<r>.npz`, its leaves in `tf.nest.flatten` order, restored into the structure
  of a fresh `initialize()`; the newest two are kept.

  Why not TFF's `tff.program.FileProgramStateManager` (used before 0.3.0): it writes a
  SavedModel, 50-80 ms a save on lasso, 1.5 ms a round at the default interval of 50
  rounds, and CPU work a background thread does not hide on two cores. An .npz takes
  about a millisecond. Each file is written to a temporary name, synced and renamed, so
  a kill never leaves a half-written checkpoint under a checkpoint's name; temporary
  files a killed run left are removed when the next run opens the directory. `save`
  writes in the background and returns at once; the next call waits for it, as do
  `wait` and `close` (raising what a save raised, e.g. a full disk).
  """

  _KEEP = 2

  def __init__(self, output_dir: pathlib.Path):
    self._root, self._damaged = output_dir / 'checkpoints', output_dir / 'checkpoints_damaged'
    self._root.mkdir(parents=True, exist_ok=True)
    for stale in self._root.glob('.state_*'):  # a killed save's temporary file
      stale.unlink(missing_ok=True)
    self._thread = concurrent.futures.ThreadPoolExecutor(1, 'checkpoints')
    self._saving: concurrent.futures.Future | None = None

  def wait(self) -> None:
    """Waits for the save under way, if any (re-raising its error)."""
    saving, self._saving = self._saving, None
    if saving is not None:
      saving.result()

  def close(self) -> None:
    try:
      self.wait()
    finally:
      self._thread.shutdown()

  def rounds(self) -> list[int]:
    """The rounds saved, oldest first."""
    self.wait()
    return self._on_disk()

  def _on_disk(self) -> list[int]:
    found = (_round_of(path) for path in self._root.glob('state_*.npz'))
    return sorted(r for r in found if r is not None)

  def clear(self) -> None:
    """Removes every checkpoint (a fresh run), those of earlier versions' format too."""
    self.wait()
    shutil.rmtree(self._root)
    self._root.mkdir(parents=True)

  def save(self, state, round_num: int) -> None:
    """Starts saving `state` as round `round_num`'s checkpoint."""
    self.wait()
    leaves = {f'leaf_{i}': np.asarray(leaf) for i, leaf in enumerate(tf.nest.flatten(state))}
    self._saving = self._thread.submit(self._write, leaves, round_num)

  def _write(self, leaves: dict[str, np.ndarray], round_num: int) -> None:
    path = self._root / f'state_{round_num}.npz'
    temporary = self._root / f'.state_{round_num}.{os.getpid()}.npz'
    with open(temporary, 'wb') as f:
      np.savez(f, **leaves)
      f.flush()
      os.fsync(f.fileno())
    os.replace(temporary, path)
    for old in self._on_disk()[:-self._KEEP]:
      (self._root / f'state_{old}.npz').unlink(missing_ok=True)

  def load_latest(self, template) -> tuple[Any, int]:
    """(state, round) of the newest readable checkpoint, or (None, 0). A damaged one (cut
    short, garbled, or of another structure than `template`) is moved to
    `checkpoints_damaged/` under a name of its own, so the run saves that round afresh
    when it gets there, and the one before it is tried."""
    expected = [np.asarray(leaf) for leaf in tf.nest.flatten(template)]
    for round_num in reversed(self.rounds()):
      path = self._root / f'state_{round_num}.npz'
      try:
        with np.load(path, allow_pickle=False) as saved:
          if len(saved.files) != len(expected):
            raise ValueError(f'{len(saved.files)} values, expected {len(expected)}')
          leaves = [saved[f'leaf_{i}'] for i in range(len(expected))]
        # Shapes must match; dtypes are those saved, the running state's (a fresh
        # state may hold a Python float where rounds hold float32).
        for i, (leaf, like) in enumerate(zip(leaves, expected)):
          if leaf.shape != like.shape:
            raise ValueError(f'value {i} has shape {list(leaf.shape)}, expected'
                             f' {list(like.shape)}')
        return tf.nest.pack_sequence_as(template, leaves), round_num
      except Exception as error:  # pylint: disable=broad-except  (any damage: set aside)
        self._set_aside(path, error)
    return None, 0

  def _set_aside(self, path: pathlib.Path, error: Exception) -> None:
    self._damaged.mkdir(parents=True, exist_ok=True)
    aside = self._damaged / f'{path.stem}.{time.time_ns()}.npz'  # never over an earlier one
    os.replace(path, aside)
    logging.warning('checkpoint of round %d is damaged (%s: %s); moved to %s.',
                    _round_of(path), type(error).__name__, error, aside)


@dataclasses.dataclass(frozen=True)
class CheckpointOptions:
  """How often a run saves its state for `--resume`."""

  checkpoint_every: int = settings.setting(
      50, 'Save the process state every this many rounds (and at the last), for'
      ' --resume.', lower=1, upper=settings.MAX_COUNT)

  def __post_init__(self):
    settings.check(self)


def _round_of(path: pathlib.Path) -> int | None:
  """The round of a checkpoint file `state_<round>.npz` (None: not one)."""
  number = path.name[len('state_'):-len('.npz')]
  return int(number) if number.isdigit() else None


# Server-state tables up to this many entries are logged entry by entry (AFL's and
# TR-MAML's client weights); larger ones (Ditto's personal models) are not.
_MAX_LOGGED_TABLE = 100


def hparam_metrics(process, state) -> Metrics:
  """The hyperparameters in force (`hparams/...`, learning rates included), as given:
  the shortest decimal of their float32 value (0.001, not 0.0010000000474974513)."""
  return {f'hparams/{k}': float(str(np.float32(v)))
          for k, v in flatten_metrics(process.get_hparams(state)).items()}


def server_quantities(state) -> Metrics:
  """The server state's scalars and small tables (`server/...`: FedDualAvg's elapsed
  coefficient, AFL's client weights), the optimizer's state aside: what defines the
  method at this round, for plots."""
  quantities = {}
  finalizer = base.server_state(state)
  for name, value in (finalizer.items() if isinstance(finalizer, Mapping) else ()):
    if name == 'optimizer' or tf.nest.is_nested(value):
      continue
    value = np.asarray(value)
    if value.ndim == 0:
      quantities[f'server/{name}'] = float(value)
    elif value.ndim == 1 and value.size <= _MAX_LOGGED_TABLE:
      quantities.update({f'server/{name}/{i}': float(v) for i, v in enumerate(value)})
  return quantities


def set_learning_rates(process, state, client_learning_rate: float,
                       server_learning_rate: float,
                       client_hparams: Mapping[str, float] | None = None):
  """Returns `state` with the client work's and server update's learning rates set, and
  the client work's other hparams named in `client_hparams` (a grid's own axes).

  A server update without a learning rate (q-FedAvg's ratio step) accepts only 1.
  """
  hparams = process.get_hparams(state)

  def put(group: str, name: str, value: float) -> None:
    # In the dtype the state holds (TFF's adaptive optimizers keep float64 hparams, and
    # one float32 among them fails their update).
    hparams[group][name] = np.asarray(value, np.asarray(hparams[group][name]).dtype)

  for name, value in (client_hparams or {}).items():
    if name not in hparams['client_work']:
      raise ValueError(f'the client work has no hyperparameter {name!r}; it has'
                       f' {sorted(hparams["client_work"])}.')
    put('client_work', name, value)
  put('client_work', 'learning_rate', client_learning_rate)
  if 'learning_rate' in hparams['finalizer']:
    put('finalizer', 'learning_rate', server_learning_rate)
  elif server_learning_rate != 1.0:
    raise ValueError('this process has no server learning rate to set.')
  return process.set_hparams(state, hparams)


class Loop:
  """What callbacks see of the run: the runtime and its state, where the run writes, the
  rounds asked for and those done before this process started (a resumed run, with the
  metrics.csv rows it keeps), the initial and latest evaluations and the clock."""

  def __init__(self, runtime, output_dir: pathlib.Path, rounds: int):
    self.runtime, self.output_dir, self.rounds = runtime, output_dir, rounds
    self.state: Any = None
    self.done = 0
    self.round_num = 0  # the last round run (its state is `state`)
    self.finished = 0  # the last round every callback has seen
    self.finished_state: Any = None  # its state
    self.saved = 0  # the newest round checkpointed
    self.interrupted = False  # stopped by Ctrl-C or SIGTERM
    self.kept_columns: list[str] = []
    self.kept_rows: list[dict[str, str]] = []
    self.initial_eval: Metrics = {}
    self.eval_metrics: Metrics = {}
    self.start = time.monotonic()
    # What buffers rows (`MetricsSink`) registers its flush here; `flush` writes them
    # all (before a checkpoint, so the rows up to it are on disk first).
    self.flushes: list[Callable[[], None]] = []

  def elapsed(self) -> float:
    return time.monotonic() - self.start

  def flush(self) -> None:
    for flush in self.flushes:
      flush()


class Callback:
  """A hook of the training loop (as pfl-research's callbacks): evaluation, metrics,
  checkpoints, progress and stopping rules are callbacks, so a new sink or an early
  stop is a new callback, not an edit of the loop. Callbacks run in the order given,
  each seeing what the ones before it added.

  on_train_begin(loop): the state is initialized, or restored (`loop.done` > 0).
  after_round(loop, round_num, metrics): after each round; may add to `metrics` (the
    round's row), raise StopTraining to end the run cleanly after this round (the
    callbacks after it still see the round), or raise an error to stop it.
  on_train_end(loop, completed): always, last; `completed` when the run ended as asked
    (every round ran, or a callback stopped it early).
  """

  def on_train_begin(self, loop: Loop) -> None:
    del loop

  def after_round(self, loop: Loop, round_num: int, metrics: Metrics) -> None:
    del loop, round_num, metrics

  def on_train_end(self, loop: Loop, completed: bool) -> None:
    del loop, completed


class DivergenceGuard(Callback):
  """Stops the run with DivergenceError when the round's training loss is not finite;
  `hint` names the algorithm's likely cause."""

  def __init__(self, hint: str):
    self._hint = hint

  def after_round(self, loop: Loop, round_num: int, metrics: Metrics) -> None:
    loss = metrics.get('train/client_work/train_loss', 0.0)
    if not math.isfinite(loss):
      raise DivergenceError(
          f'training diverged at round {round_num}: train loss {loss}; {self._hint}.')


class Evaluator(Callback):
  """Evaluates the state at the start, every `eval_period` rounds and at the last
  (`eval/...` columns); with `evaluate_clients`, one CSV of per-client rows each time
  (`clients/eval_round_<r>.csv`)."""

  def __init__(self, evaluate: Callable[[Any], Metrics], eval_period: int,
               evaluate_clients: Callable[[Any], list[dict[str, Any]]] | None = None):
    self._evaluate, self._period, self._clients = evaluate, eval_period, evaluate_clients

  def _run(self, loop: Loop, round_num: int) -> Metrics:
    """The evaluation's metrics, with its wall time as `eval/seconds` (kept out of
    `loop.eval_metrics`, which holds what the model scored)."""
    start = time.perf_counter()
    if self._clients is not None:
      write_client_rows(loop.output_dir / 'clients' / f'eval_round_{round_num:05d}.csv',
                        self._clients(loop.state))
    loop.eval_metrics = {f'eval/{k}': v for k, v in self._evaluate(loop.state).items()}
    return {**loop.eval_metrics, 'eval/seconds': time.perf_counter() - start}

  def on_train_begin(self, loop: Loop) -> None:
    loop.initial_eval = self._run(loop, loop.done)

  def after_round(self, loop: Loop, round_num: int, metrics: Metrics) -> None:
    if round_num % self._period == 0 or round_num == loop.rounds:
      metrics.update(self._run(loop, round_num))


class Progress(Callback):
  """A live bar on a terminal; one line per evaluation in logs (CI, files)."""

  def __init__(self, show: bool):
    self._show = show
    self._interactive = show and sys.stderr.isatty()
    self._bar = None

  def on_train_begin(self, loop: Loop) -> None:
    self._bar = tqdm.tqdm(total=loop.rounds, initial=loop.done, disable=not self._interactive,
                          file=sys.stderr, unit='round', dynamic_ncols=True)

  def after_round(self, loop: Loop, round_num: int, metrics: Metrics) -> None:
    if any(k.startswith('eval/') for k in metrics):
      summary = {k: f'{v:.4g}' for k, v in loop.eval_metrics.items()}  # the CSV's names
      self._bar.set_postfix(summary, refresh=False)
      if self._show and not self._interactive:
        # The round's loss at the visited iterates, then the evaluation's metrics
        # (a task's own `train_loss` is its evaluation on the pooled training data).
        loss = metrics.get('train/client_work/train_loss', 0.0)
        # One write, line and newline together: a Ctrl-C between them would glue the
        # next line (the interrupt's) to this one.
        sys.stderr.write(f'round {round_num}/{loop.rounds} ({loop.elapsed():.1f}s):'
                         f' train/client_work/train_loss={loss:.4g} '
                         + ' '.join(f'{k}={v}' for k, v in summary.items()) + '\n')
        sys.stderr.flush()
    self._bar.update()

  def on_train_end(self, loop: Loop, completed: bool) -> None:
    if self._bar is not None:
      self._bar.close()


class MetricsSink(Callback):
  """metrics.csv and TensorBoard (`MetricsWriter`): round 0 holds the initial
  evaluation, then a row per round with its `seconds` since the start; a resumed run
  rewrites the rows it keeps. The columns are those of the first round that trained
  (rows of earlier rounds where nobody reported wait for it)."""

  def __init__(self):
    self._writer: MetricsWriter | None = None
    self._waiting: list[tuple[int, float, Metrics]] = []

  def on_train_begin(self, loop: Loop) -> None:
    loop.flushes.append(self._flush)
    if loop.kept_rows:
      self._writer = MetricsWriter(loop.output_dir, loop.kept_columns, loop.kept_rows)

  def _flush(self) -> None:
    if self._writer is not None:
      self._writer.flush()

  def _open(self, loop: Loop, metrics: Metrics) -> None:
    columns = sorted(k for k in metrics if not k.startswith('eval/'))
    self._writer = MetricsWriter(loop.output_dir, columns + sorted(loop.initial_eval))
    self._writer.write(0, 0.0, loop.initial_eval)
    for row in self._waiting:
      self._writer.write(*row)

  def after_round(self, loop: Loop, round_num: int, metrics: Metrics) -> None:
    if self._writer is None:
      if not any(k.startswith('train/') for k in metrics):
        self._waiting.append((round_num, loop.elapsed(), dict(metrics)))
        return
      self._open(loop, metrics)
    self._writer.write(round_num, loop.elapsed(), metrics)

  def on_train_end(self, loop: Loop, completed: bool) -> None:
    if self._writer is None:  # stopped before a round trained: still write what ran
      self._open(loop, self._waiting[-1][2] if self._waiting else {})
    loop.flushes.remove(self._flush)
    self._writer.close()


class RunRecord(Callback):
  """config.json: the run's configuration and its runtime's record, written at the
  start of a fresh run and again after the first round (the engine actually used)."""

  def __init__(self, config: Mapping[str, Any]):
    self._config = config

  def _write(self, loop: Loop) -> None:
    config = dict(self._config, runtime_record=getattr(loop.runtime, 'record', None))
    if 'resolved' in config and hasattr(loop.runtime, 'description'):
      config['resolved'] = dict(config['resolved'], runtime=loop.runtime.description)
    write_whole(loop.output_dir / 'config.json', json.dumps(config, indent=2, default=str))

  def on_train_begin(self, loop: Loop) -> None:
    if not loop.done:
      self._write(loop)

  def after_round(self, loop: Loop, round_num: int, metrics: Metrics) -> None:
    if round_num == loop.done + 1:
      self._write(loop)


class Checkpointer(Callback):
  """Saves the state every `every` rounds, at the last, at an early stop and when
  interrupted (Ctrl-C, SIGTERM) after a finished round (`Checkpoints`)."""

  def __init__(self, checkpoints: Checkpoints, every: int):
    self._checkpoints, self._every = checkpoints, every

  def on_train_begin(self, loop: Loop) -> None:
    loop.saved = loop.done

  def after_round(self, loop: Loop, round_num: int, metrics: Metrics) -> None:
    if round_num % self._every == 0 or round_num == loop.rounds:
      loop.flush()
      self._checkpoints.save(loop.state, round_num)
      loop.saved = round_num

  def on_train_end(self, loop: Loop, completed: bool) -> None:
    # The last round every callback saw (a stop during a round's callbacks may have
    # left its row unwritten: that round is redone on resume).
    if (completed or loop.interrupted) and loop.finished > loop.saved:
      loop.flush()
      self._checkpoints.save(loop.finished_state, loop.finished)
      loop.saved = loop.finished
    self._checkpoints.close()


def save_model(path: pathlib.Path, weights) -> None:
  """Writes ModelWeights to an .npz with one array per weight, named by its place:
  `trainable_<i>` and `non_trainable_<i>` (`load_model` reads it back)."""
  arrays = {f'{part}_{i}': np.asarray(w) for part in ('trainable', 'non_trainable')
            for i, w in enumerate(getattr(weights, part))}
  np.savez(path, **arrays)


def load_model(path: str | os.PathLike) -> Any:
  """The `tff.learning.models.ModelWeights` (tuples of NumPy arrays) in `save_model`'s
  file, e.g. a run's final_model.npz."""
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

  with np.load(path) as saved:
    def part(name):
      count = sum(key.startswith(f'{name}_') and key[len(name) + 1:].isdigit()
                  for key in saved.files)
      return tuple(saved[f'{name}_{i}'] for i in range(count))
    return tff.learning.models.ModelWeights(part('trainable'), part('non_trainable'))


class FinalModel(Callback):
  """final_model.npz: the trained model's weights after the last round (`save_model`;
  `load_model` reads them back)."""

  def on_train_end(self, loop: Loop, completed: bool) -> None:
    if completed:
      save_model(loop.output_dir / 'final_model.npz',
                 loop.runtime.get_model_weights(loop.state))


SAMPLINGS = ('uniform', 'with_replacement', 'poisson')


@dataclasses.dataclass(frozen=True)
class Participation:
  """How a round's clients are drawn and which of them finish their work.

  sampling: 'uniform' (k distinct clients), 'with_replacement' (k draws; a client drawn
    twice trains twice) or 'poisson' (each client independently with probability
    k / population: cohorts of varying size, as DP accounting assumes).
  dropout_rate: the chance that a sampled client fails to report; its update is lost
    and the round aggregates the others' (none: the model is unchanged).
  straggler_rate: the chance that a reporting client is a straggler, completing only
    `straggler_work` of its local steps (at least one; FedNova's a_i counts the steps
    done).
  """

  sampling: str = settings.setting(
      'uniform', 'How each round\'s clients are drawn: uniform (--clients_per_round'
      ' distinct clients), with_replacement, or poisson (each client with probability'
      ' clients_per_round / population; cohorts vary in size).', choices=SAMPLINGS)
  dropout_rate: float = settings.setting(
      0.0, 'Chance that a sampled client fails to report (its update is lost; a round'
      ' nobody reports leaves the model as it was).', lower=0.0)
  straggler_rate: float = settings.setting(
      0.0, 'Chance that a reporting client straggles, doing only --straggler_work of its'
      ' local steps (in-process runtime).', lower=0.0)
  straggler_work: float = settings.setting(
      0.5, 'The share of its local steps a straggler completes (at least one step).',
      above=0.0, upper=1.0)

  def __post_init__(self):
    settings.check(self)
    for name in ('dropout_rate', 'straggler_rate'):
      if not getattr(self, name) < 1.0:
        raise ValueError(f'--{name} must be in [0, 1), got {getattr(self, name)}.')


class RoundClients(NamedTuple):
  """A round's clients: those sampled, those reporting (in order; a runtime trains
  these) and each reporting client's share of its local steps (None: all of them)."""

  sampled: tuple[str, ...]
  reporting: tuple[str, ...]
  work: tuple[float, ...] | None

  def metrics(self) -> Metrics:
    """participation/sampled, /reporting, /straggling: clients counted per round."""
    return {'participation/sampled': float(len(self.sampled)),
            'participation/reporting': float(len(self.reporting)),
            'participation/straggling': float(sum(w < 1 for w in self.work or ()))}


class ClientSampler:
  """The loop's sampling hook: `sample(round_num)` draws round `round_num`'s clients
  (`Participation` says how) from a NumPy generator seeded by (seed, round), so any
  round's draw is the same in every run with `seed`, resumed or not.

  A replacement is any object with `sample(round_num) -> RoundClients` and a
  `capacity` (the most reporting clients a round may have, a hint for runtimes that
  compile per cohort size).
  """

  def __init__(self, client_ids: Sequence[str], clients_per_round: int, seed: int,
               participation: Participation = Participation()):
    self._ids, self._k, self._seed = list(client_ids), clients_per_round, seed
    self.participation = participation
    n = len(self._ids)
    if participation.sampling == 'poisson':
      # The cohort is Binomial(n, q): five standard deviations above its mean.
      q = min(1.0, clients_per_round / n)
      self.capacity = min(n, math.ceil(clients_per_round + 5 * math.sqrt(
          clients_per_round * (1 - q)) + 1))
    else:
      self.capacity = clients_per_round

  def sample(self, round_num: int) -> RoundClients:
    rng = np.random.default_rng([self._seed, round_num])
    p, n = self.participation, len(self._ids)
    if p.sampling == 'poisson':
      chosen = np.flatnonzero(rng.random(n) < min(1.0, self._k / n))
    else:
      chosen = rng.choice(n, self._k, replace=p.sampling == 'with_replacement')
    sampled = tuple(self._ids[i] for i in chosen)
    reporting = tuple(c for c, u in zip(sampled, rng.random(len(sampled)), strict=True)
                      if u >= p.dropout_rate)
    straggling = rng.random(len(reporting)) < p.straggler_rate
    work = (tuple(p.straggler_work if s else 1.0 for s in straggling)
            if straggling.any() else None)
    return RoundClients(sampled, reporting, work)


class OutputDirInUse(RuntimeError):
  """Another process runs in this output directory; the message names its pid."""


@contextlib.contextmanager
def output_lock(output_dir: pathlib.Path):
  """Holds an advisory lock on `output_dir/.lock` (holding this process's pid) while the
  context runs, so two runs or resumes never write one directory; raises OutputDirInUse
  when another process holds it. The OS releases it when the holder dies."""
  output_dir.mkdir(parents=True, exist_ok=True)
  lock = open(output_dir / '.lock', 'a+')  # pylint: disable=consider-using-with
  try:
    try:
      fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      lock.seek(0)
      holder = lock.read().strip() or 'unknown'
      raise OutputDirInUse(f'--output_dir={output_dir} is in use by another run (pid'
                           f' {holder}); wait for it to end or choose another'
                           ' directory.') from None
    lock.seek(0)
    lock.truncate()
    lock.write(str(os.getpid()))
    lock.flush()
    yield
  finally:
    lock.close()  # releases the lock


def _start_fresh(loop: Loop, checkpoints: Checkpoints) -> None:
  """A fresh run in `loop.output_dir`: nothing of a replaced run may be resumed later."""
  checkpoints.clear()
  shutil.rmtree(loop.output_dir / 'checkpoints_damaged', ignore_errors=True)
  shutil.rmtree(loop.output_dir / 'clients', ignore_errors=True)
  (loop.output_dir / 'final_model.npz').unlink(missing_ok=True)


def _restore(loop: Loop, checkpoints: Checkpoints) -> None:
  """Continues the run in `loop.output_dir` from its newest readable checkpoint: the
  state and the metrics rows up to it (the sampler draws by round). Nothing saved: a
  fresh run."""
  saved, done = checkpoints.load_latest(loop.state)
  if saved is None:
    _start_fresh(loop, checkpoints)
    return
  loop.state, loop.done = saved, done
  loop.kept_columns, loop.kept_rows = _read_rows(loop.output_dir / 'metrics.csv', done)
  loop.start -= float(loop.kept_rows[-1]['seconds']) if loop.kept_rows else 0.0


def run_loop(runtime, loop: Loop, sampler: ClientSampler,
             callbacks: list[Callback],
             rates: Callable[[int], tuple[float, float]] | None = None) -> None:
  """The loop: rounds `loop.done + 1 .. loop.rounds` on the sampler's clients, each
  round's metrics (`train/...`, `participation/...`, `hparams/...`, `server/...`,
  `seconds_per_round`: the round's training, from sampling to its metrics on the host)
  handed to the callbacks in order. A round where no sampled client reports leaves the
  state as it was (logged; no train/ metrics). `rates`, if given, maps a round to its
  (client, server) learning rates, set before it runs."""
  reserve, prefetch = getattr(runtime, 'reserve_cohort', None), getattr(runtime, 'prefetch',
                                                                         None)
  if reserve is not None:
    reserve(sampler.capacity)
  # Each round is drawn once: the draw of round r + 1 is read ahead (prefetch) and used
  # by round r + 1.
  upcoming = sampler.sample(loop.done + 1) if loop.done < loop.rounds else None
  if prefetch is not None and upcoming is not None:  # read while the run starts
    prefetch(upcoming.reporting)
  for callback in callbacks:
    callback.on_train_begin(loop)
  # Set before the first round and unchanged after it: read once, logged every round
  # (on TFF's runtime reading them is a computation call).
  hparams = hparam_metrics(runtime, loop.state)
  completed, stop = False, None
  try:
    for round_num in range(loop.done + 1, loop.rounds + 1):
      start = time.perf_counter()
      if rates is not None:
        client_rate, server_rate = rates(round_num)
        loop.state = set_learning_rates(runtime, loop.state, client_rate, server_rate)
        # The logged rates follow from the values just set (no second read of the state).
        for key, rate in (('hparams/client_work/learning_rate', client_rate),
                          ('hparams/finalizer/learning_rate', server_rate)):
          if key in hparams:
            hparams[key] = float(str(np.float32(rate)))
      clients = upcoming
      upcoming = sampler.sample(round_num + 1) if round_num < loop.rounds else None
      metrics = clients.metrics()
      if prefetch is not None and upcoming is not None:  # read while this round runs
        prefetch(upcoming.reporting)
      if clients.reporting:
        output = runtime.next(loop.state, list(clients.reporting), clients.work)
        loop.state = output.state
        metrics.update({f'train/{k}': v for k, v in flatten_metrics(output.metrics).items()})
      else:
        logging.warning('round %d: none of the %d sampled clients reported; the model is'
                        ' unchanged.', round_num, len(clients.sampled))
      loop.round_num = round_num
      metrics.update(hparams)
      metrics.update(server_quantities(loop.state))
      metrics['seconds_per_round'] = time.perf_counter() - start
      for callback in callbacks:
        try:
          callback.after_round(loop, round_num, metrics)
        except StopTraining as request:
          stop = request  # the callbacks after it still see this round
      loop.finished, loop.finished_state = round_num, loop.state
      if _SIGTERM_RECEIVED.is_set():
        _SIGTERM_RECEIVED.clear()
        raise KeyboardInterrupt('SIGTERM')
      if stop is not None:
        break
    completed = True
  except KeyboardInterrupt:
    loop.interrupted = True
    raise
  finally:
    for callback in callbacks:
      callback.on_train_end(loop, completed)


def run_simulation(
    process: Any,
    *,
    client_ids: list[str],
    evaluate: Callable[[Any], Metrics],
    rounds: int,
    clients_per_round: int,
    seed: int,
    eval_period: int,
    output_dir: pathlib.Path,
    config: Mapping[str, Any],
    show_progress: bool = True,
    learning_rates: tuple[float, float] | None = None,
    client_hparams: Mapping[str, float] | None = None,
    schedules: tuple[Any, Any] | None = None,
    divergence_hint: str = 'try a smaller learning rate',
    checkpoint_every: int = 50,
    resume: bool = False,
    evaluate_clients: Callable[[Any], list[dict[str, Any]]] | None = None,
    callbacks: tuple[Callback, ...] = (),
    participation: Participation = Participation(),
    sampler: Any = None,
) -> Metrics:
  """Trains the runtime `process` for `rounds` rounds; returns the last evaluation.

  `process` is a `runtime.base.Runtime` (`choice.runner_for`). Each round's
  clients are drawn as `participation` says (`ClientSampler`, seeded by `seed`), or by
  `sampler`, any object with `sample(round_num) -> RoundClients` and a `capacity`.
  `evaluate` maps the state to metrics (`evaluation.evaluator` builds it for a task).
  `config` is written to `config.json` beside the metrics. `learning_rates`, if given,
  sets (client, server) learning rates through the hparams, and `client_hparams` the
  client work's other hparams by name, so one built runtime serves a whole grid.
  `schedules` (client, server) are `schedules.Schedule`s scaling those rates (or the
  process's own) round by round. A run already in `output_dir` is replaced
  (`run_directory.check_output_dir` refuses that unless asked), or with `resume`
  continued from its last checkpoint: the state is saved every `checkpoint_every`
  rounds and at the last one, sampling depends on the round only, and the rows after the
  checkpoint are dropped, so a resumed run ends exactly as an uninterrupted one (its
  caller checks that the configuration matches). The final model's trainable weights
  go to `final_model.npz`. `divergence_hint` ends the divergence message (the likely
  cause for the algorithm). `evaluate_clients`, if given, maps the state to one row
  per client, written at every evaluation to `clients/eval_round_<r>.csv`.
  `callbacks` run after the divergence guard and the evaluator and before the
  progress line, the metrics sink (so what they add to a round's metrics is written),
  the run record, checkpoints and the final model.

  Raises:
    DivergenceError: the training loss became non-finite.
    Interrupted: Ctrl-C (or SIGTERM, with `stop_on_sigterm`); the last finished round
      is saved first.
  """
  output_dir.mkdir(parents=True, exist_ok=True)
  for prefix in _TEMPORARY:  # what a killed run was writing (this run holds the lock)
    for stale in output_dir.glob(f'{prefix}*'):
      stale.unlink(missing_ok=True)
  checkpoints = Checkpoints(output_dir)
  sampler = sampler or ClientSampler(client_ids, clients_per_round, seed, participation)
  loop = Loop(process, output_dir, rounds)
  loop.state = process.initialize()
  if learning_rates is not None:
    loop.state = set_learning_rates(process, loop.state, *learning_rates, client_hparams)
  rates = None
  if schedules is not None and not all(schedule.constant for schedule in schedules):
    hparams = process.get_hparams(loop.state)
    base = (float(hparams['client_work']['learning_rate']),
            float(hparams['finalizer'].get('learning_rate', 1.0)))

    def rates(round_num: int) -> tuple[float, float]:
      return tuple(rate * schedule.factor(round_num)
                   for rate, schedule in zip(base, schedules))
  if resume and (output_dir / 'metrics.csv').exists():
    _restore(loop, checkpoints)
    if show_progress:
      print(f'resuming from round {loop.done}' if loop.done else
            'resuming: no checkpoint was saved, starting from round 0', flush=True)
  else:
    _start_fresh(loop, checkpoints)
  try:
    run_loop(process, loop, sampler, [
        DivergenceGuard(divergence_hint), Evaluator(evaluate, eval_period, evaluate_clients),
        *callbacks, Progress(show_progress), MetricsSink(), RunRecord(config),
        Checkpointer(checkpoints, checkpoint_every), FinalModel()], rates)
  except KeyboardInterrupt as interrupt:
    raise Interrupted(loop.saved) from interrupt
  return loop.eval_metrics
