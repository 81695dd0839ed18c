"""The training loop's callbacks (as pfl-research's): evaluation, metrics, progress,
checkpoints, the run record, the final model and the divergence guard, and `Loop`, what
they see of the run."""

from collections.abc import Callable, Mapping, Sequence
import json
import math
import pathlib
import sys
import time
from typing import Any

import numpy as np
import tensorflow as tf
import tqdm

from tff_comp.ops.rule import LEARNING_RATE
from tff_comp.run import checkpoints as checkpoints_lib
from tff_comp.run import outputs
from tff_comp.runtime import base, client_rows


class DivergenceError(RuntimeError):
  """Training produced a non-finite loss."""


class StopTraining(Exception):
  """Raised by a callback's `after_round` to end the run cleanly after that round (an
  early stop): the round's row is kept, the state checkpointed, the model saved. With
  `interrupt`, the run then ends as an interrupted one (KeyboardInterrupt: SIGTERM)."""

  def __init__(self, *args, interrupt: bool = False):
    super().__init__(*args)
    self.interrupt = interrupt


# Server-state tables up to this many entries are logged entry by entry (AFL's and
# TR-MAML's client weights); larger ones (Ditto's personal models) are not.
_MAX_LOGGED_TABLE = 100


def set_learning_rates(
  process,
  state,
  client_learning_rate: float,
  server_learning_rate: float,
  client_hparams: Mapping[str, float] | None = None,
):
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
      raise ValueError(
        f'the client work has no hyperparameter {name!r}; it has {sorted(hparams["client_work"])}.'
      )
    put('client_work', name, value)
  put('client_work', LEARNING_RATE, client_learning_rate)
  if LEARNING_RATE in hparams['finalizer']:
    put('finalizer', LEARNING_RATE, server_learning_rate)
  elif server_learning_rate != 1.0:
    raise ValueError('this process has no server learning rate to set.')
  return process.set_hparams(state, hparams)


def hparam_metrics(process, state) -> outputs.Metrics:
  """The hyperparameters in force (`hparams/...`, learning rates included), as given:
  the shortest decimal of their float32 value (0.001, not 0.0010000000474974513)."""
  return {
    f'hparams/{k}': float(str(np.float32(v)))
    for k, v in outputs.flatten_metrics(process.get_hparams(state)).items()
  }


def server_quantities(state) -> outputs.Metrics:
  """The server state's scalars and small tables (`server/...`: FedDualAvg's elapsed
  coefficient, AFL's client weights), the optimizer's state aside: what defines the
  method at this round, for plots. A table of per-client flags that the state's type
  names in `counted` is logged as its sum (Local-MOML's `seen`: the clients whose
  memory is set)."""
  quantities = {}
  finalizer = base.server_state(state)  # a server rule's NamedTuple (a plugin's mapping)
  fields = (
    finalizer._asdict()
    if hasattr(finalizer, '_asdict')
    else finalizer
    if isinstance(finalizer, Mapping)
    else {}
  )
  counted = getattr(type(finalizer), 'counted', ())
  for name, value in fields.items():
    if name == 'optimizer' or tf.nest.is_nested(value):
      continue
    if isinstance(value, client_rows.Held):  # client state held elsewhere: its sum
      if name in counted:
        quantities[f'server/{name}'] = value.total
      continue
    value = np.asarray(value)
    if name in counted:
      quantities[f'server/{name}'] = float(value.sum())
    elif value.ndim == 0:
      quantities[f'server/{name}'] = float(value)
    elif value.ndim == 1 and value.size <= _MAX_LOGGED_TABLE:
      quantities.update({f'server/{name}/{i}': float(v) for i, v in enumerate(value)})
  return quantities


class Loop:
  """What callbacks see of the run: the runtime and its state, where the run writes, the
  rounds asked for and those done before this process started (a resumed run, with the
  metrics.csv rows it keeps), the initial and latest evaluations and the clock."""

  def __init__(self, runtime, output_dir: pathlib.Path, rounds: int):
    self.runtime, self.output_dir, self.rounds = runtime, output_dir, rounds
    self.state: Any = None
    # The hyperparameters of the state before any restore (`Runtime.get_hparams`; not that
    # state, whose per-client tables may be large and held elsewhere once the run starts).
    self.initial_hparams: Any = None
    self.done = 0
    self.round_num = 0  # the last round run (its state is `state`)
    self.finished = 0  # the last round every callback has seen
    self.finished_state: Any = None  # its state
    self.saved = 0  # the newest round checkpointed
    self.interrupted = False  # stopped by Ctrl-C or SIGTERM
    self.kept_columns: list[str] = []
    self.kept_rows: list[dict[str, str]] = []
    self.upcoming: Any = None  # the next round's clients (sampling.RoundClients), drawn
    self.hparams: outputs.Metrics = {}  # the hyperparameters in force, logged each round
    self.initial_eval: outputs.Metrics = {}
    self.eval_metrics: outputs.Metrics = {}
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
  before_round(loop, round_num, clients): before each round runs on `clients` (its
    `sampling.RoundClients`; `loop.upcoming` is the next round's); may change
    `loop.state` (the round's learning rates) and `loop.hparams`.
  after_round(loop, round_num, metrics): after each round; may add to `metrics` (the
    round's row), raise StopTraining to end the run cleanly after this round (the
    callbacks after it still see the round), or raise an error to stop it.
  on_train_end(loop, completed): always, last; `completed` when the run ended as asked
    (every round ran, or a callback stopped it early).
  """

  def on_train_begin(self, loop: Loop) -> None:
    del loop

  def before_round(self, loop: Loop, round_num: int, clients: Any) -> None:
    del loop, round_num, clients

  def after_round(self, loop: Loop, round_num: int, metrics: outputs.Metrics) -> None:
    del loop, round_num, metrics

  def on_train_end(self, loop: Loop, completed: bool) -> None:
    del loop, completed


class CohortReader(Callback):
  """Lets the runtime get ready for its cohorts: compile once for the largest
  (`reserve_cohort(capacity)`) and read each round's clients while the round before it
  runs (`prefetch`; the first while the run starts). First in the list."""

  def __init__(self, capacity: int):
    self._capacity = capacity

  def on_train_begin(self, loop: Loop) -> None:
    loop.runtime.reserve_cohort(self._capacity)
    self.before_round(loop, loop.done, None)

  def before_round(self, loop: Loop, round_num: int, clients: Any) -> None:
    if loop.upcoming is not None:
      loop.runtime.prefetch(loop.upcoming.reporting)


class LearningRates(Callback):
  """Sets each round's (client, server) learning rates before it runs: `rates(round)`
  (a schedule's), logged as the round's hparams."""

  def __init__(self, rates: Callable[[int], tuple[float, float]]):
    self._rates = rates

  def before_round(self, loop: Loop, round_num: int, clients: Any) -> None:
    client_rate, server_rate = self._rates(round_num)
    loop.state = set_learning_rates(loop.runtime, loop.state, client_rate, server_rate)
    # The logged rates follow from the values just set (no second read of the state).
    for key, rate in (
      (f'hparams/client_work/{LEARNING_RATE}', client_rate),
      (f'hparams/finalizer/{LEARNING_RATE}', server_rate),
    ):
      if key in loop.hparams:
        loop.hparams[key] = float(str(np.float32(rate)))


class Schedules(LearningRates):
  """Scales the run's first (client, server) learning rates round by round by the
  factors of `schedules.Schedule`s (read from `loop.initial_hparams`, so a resumed run
  scales the same rates)."""

  def __init__(self, client: Any, server: Any):
    super().__init__(self._scaled)
    self._schedules, self._initial = (client, server), (1.0, 1.0)

  def on_train_begin(self, loop: Loop) -> None:
    hparams = loop.initial_hparams
    self._initial = (
      float(hparams['client_work'][LEARNING_RATE]),
      float(hparams['finalizer'].get(LEARNING_RATE, 1.0)),
    )

  def _scaled(self, round_num: int) -> tuple[float, float]:
    return tuple(
      rate * schedule.factor(round_num) for rate, schedule in zip(self._initial, self._schedules)
    )


class DivergenceGuard(Callback):
  """Stops the run with DivergenceError when the round's training loss is not finite
  (before the evaluator: a diverged model is not evaluated) or, with `evaluated`, a
  loss or objective its evaluation scored (`eval/...`; after the evaluator), before
  the round is written or checkpointed; `hint` names the algorithm's likely cause."""

  def __init__(self, hint: str, evaluated: bool = False):
    self._hint, self._evaluated = hint, evaluated

  def after_round(self, loop: Loop, round_num: int, metrics: outputs.Metrics) -> None:
    if self._evaluated:
      watched = {
        name: value
        for name, value in metrics.items()
        if name.startswith('eval/') and ('loss' in name or 'objective' in name)
      }
    else:
      watched = {'train loss': metrics.get('train/client_work/train_loss', 0.0)}
    for name, value in watched.items():
      if not math.isfinite(value):
        raise DivergenceError(
          f'training diverged at round {round_num}: {name} {value}; {self._hint}.'
        )


class Evaluator(Callback):
  """Evaluates the state at the start, every `eval_period` rounds and at the last
  (`eval/...` columns); with `evaluate_clients`, one CSV of per-client rows each time
  (`clients/eval_round_<r>.csv`)."""

  def __init__(
    self,
    evaluate: Callable[[Any], outputs.Metrics],
    eval_period: int,
    evaluate_clients: Callable[[Any], list[dict[str, Any]]] | None = None,
  ):
    self._evaluate, self._period, self._clients = evaluate, eval_period, evaluate_clients

  def _run(self, loop: Loop, round_num: int) -> outputs.Metrics:
    """The evaluation's metrics, with its wall time as `eval/seconds` (kept out of
    `loop.eval_metrics`, which holds what the model scored)."""
    start = time.perf_counter()
    if self._clients is not None:
      outputs.write_client_rows(
        loop.output_dir / 'clients' / f'eval_round_{round_num:05d}.csv', self._clients(loop.state)
      )
    loop.eval_metrics = {f'eval/{k}': v for k, v in self._evaluate(loop.state).items()}
    return {**loop.eval_metrics, 'eval/seconds': time.perf_counter() - start}

  def on_train_begin(self, loop: Loop) -> None:
    loop.initial_eval = self._run(loop, loop.done)

  def after_round(self, loop: Loop, round_num: int, metrics: outputs.Metrics) -> None:
    if round_num % self._period == 0 or round_num == loop.rounds:
      metrics.update(self._run(loop, round_num))


# Columns the progress line shows beside the evaluation's, where a run writes them.
_ALSO_SHOWN = ('time/simulated_seconds', 'participation/late', 'privacy/epsilon')
# In a log, a round's line at least this often between evaluations (an EMNIST run
# evaluating every 100 rounds said nothing for minutes).
SAY_EVERY_S = 30.0


class Progress(Callback):
  """A live bar on a terminal; one line per evaluation in logs (CI, files); `also`: more
  columns it shows where the run writes them (a compressed run's comm/upload_bytes)."""

  def __init__(self, show: bool, also: Sequence[str] = ()):
    self._show, self._also = show, (*_ALSO_SHOWN, *also)
    self._said = time.monotonic()  # when it last wrote a line
    self._interactive = show and sys.stderr.isatty()
    self._bar: tqdm.tqdm | None = None

  def on_train_begin(self, loop: Loop) -> None:
    self._bar = tqdm.tqdm(
      total=loop.rounds,
      initial=loop.done,
      disable=not self._interactive,
      file=sys.stderr,
      unit='round',
      dynamic_ncols=True,
    )

  def after_round(self, loop: Loop, round_num: int, metrics: outputs.Metrics) -> None:
    assert self._bar is not None, 'after_round before on_train_begin'
    evaluated = any(k.startswith('eval/') for k in metrics)
    summary = {}
    if evaluated:
      summary = {k: f'{v:.4g}' for k, v in loop.eval_metrics.items()}  # the CSV's names
      # Where the run has them: its simulated clock, the clients late this round, the
      # privacy spent.
      summary.update({k: f'{metrics[k]:.4g}' for k in self._also if k in metrics})
      self._bar.set_postfix(summary, refresh=False)
    due = time.monotonic() - self._said >= SAY_EVERY_S
    if self._show and not self._interactive and (evaluated or due):
      # The round's loss at the visited iterates, then the evaluation's metrics
      # (a task's own `train_loss` is its evaluation on the pooled training data).
      loss = metrics.get('train/client_work/train_loss', 0.0)
      # One write, line and newline together: a Ctrl-C between them would glue the
      # next line (the interrupt's) to this one.
      sys.stderr.write(
        f'round {round_num}/{loop.rounds} ({loop.elapsed():.1f}s):'
        f' train/client_work/train_loss={loss:.4g}'
        + ''.join(f' {k}={v}' for k, v in summary.items())
        + '\n'
      )
      sys.stderr.flush()
      self._said = time.monotonic()
    self._bar.update()

  def on_train_end(self, loop: Loop, completed: bool) -> None:
    if self._bar is not None:
      self._bar.close()


class Communication(Callback):
  """comm/upload_bytes and comm/download_bytes of each round: what its reporting clients
  send and its sampled clients receive (`ops.communication.client_bytes`: per client)."""

  def __init__(self, upload: float, download: float):
    self._upload, self._download = upload, download

  def after_round(self, loop: Loop, round_num: int, metrics: outputs.Metrics) -> None:
    metrics['comm/upload_bytes'] = metrics['participation/reporting'] * self._upload
    metrics['comm/download_bytes'] = metrics['participation/sampled'] * self._download


class Poisoned(Callback):
  """participation/poisoned: the round's reporting clients that train on flipped
  labels (`--attack=label_flip`; `attackers` from `tff_comp.poisoning.attackers`)."""

  def __init__(self, attackers: frozenset[str]):
    self._attackers, self._count = attackers, 0

  def before_round(self, loop: Loop, round_num: int, clients: Any) -> None:
    self._count = sum(cid in self._attackers for cid in clients.reporting)

  def after_round(self, loop: Loop, round_num: int, metrics: outputs.Metrics) -> None:
    metrics['participation/poisoned'] = self._count


class MetricsSink(Callback):
  """metrics.csv and TensorBoard (`MetricsWriter`): round 0 holds the initial
  evaluation, then a row per round with its `seconds` since the start; a resumed run
  rewrites the rows it keeps. The columns are those of the first round that trained
  (rows of earlier rounds where nobody reported wait for it)."""

  def __init__(self):
    self._writer: outputs.MetricsWriter | None = None
    self._waiting: list[tuple[int, float, outputs.Metrics]] = []

  def on_train_begin(self, loop: Loop) -> None:
    loop.flushes.append(self._flush)
    if loop.kept_rows:
      self._writer = outputs.MetricsWriter(loop.output_dir, loop.kept_columns, loop.kept_rows)

  def _flush(self) -> None:
    if self._writer is not None:
      self._writer.flush()

  def _open(self, loop: Loop, metrics: outputs.Metrics) -> outputs.MetricsWriter:
    columns = sorted(k for k in metrics if not k.startswith('eval/'))
    writer = outputs.MetricsWriter(loop.output_dir, columns + sorted(loop.initial_eval))
    writer.write(0, 0.0, loop.initial_eval)
    for row in self._waiting:
      writer.write(*row)
    return writer

  def after_round(self, loop: Loop, round_num: int, metrics: outputs.Metrics) -> None:
    if self._writer is None:
      if not any(k.startswith('train/') for k in metrics):
        self._waiting.append((round_num, loop.elapsed(), dict(metrics)))
        return
      self._writer = self._open(loop, metrics)
    self._writer.write(round_num, loop.elapsed(), metrics)

  def on_train_end(self, loop: Loop, completed: bool) -> None:
    if self._writer is None:  # stopped before a round trained: still write what ran
      self._writer = self._open(loop, self._waiting[-1][2] if self._waiting else {})
    loop.flushes.remove(self._flush)
    self._writer.close()


class RunRecord(Callback):
  """config.json: the run's configuration and its runtime's record, written at the
  start of a fresh run and again after the first round (the engine actually used)."""

  def __init__(self, config: Mapping[str, Any]):
    self._config = config

  def _write(self, loop: Loop) -> None:
    config = dict(self._config, runtime_record=loop.runtime.record)
    if 'resolved' in config and hasattr(loop.runtime, 'description'):
      config['resolved'] = dict(config['resolved'], runtime=loop.runtime.description)
    outputs.write_whole(loop.output_dir / 'config.json', json.dumps(config, indent=2, default=str))

  def on_train_begin(self, loop: Loop) -> None:
    if not loop.done:
      self._write(loop)

  def after_round(self, loop: Loop, round_num: int, metrics: outputs.Metrics) -> None:
    if round_num == loop.done + 1:
      self._write(loop)


class Checkpointer(Callback):
  """Saves the state every `every` rounds, at the last, at an early stop and when
  interrupted (Ctrl-C, SIGTERM) after a finished round (`Checkpoints`), each with its
  round's metrics (compared with metrics.csv's when resumed)."""

  def __init__(self, checkpoints: checkpoints_lib.Checkpoints):
    self._checkpoints, self._every = checkpoints, checkpoints.options.checkpoint_every
    self._last: tuple[int, outputs.Metrics] = (0, {})  # the last round seen, its metrics

  def on_train_begin(self, loop: Loop) -> None:
    loop.saved = loop.done

  def after_round(self, loop: Loop, round_num: int, metrics: outputs.Metrics) -> None:
    self._last = (round_num, metrics)
    if round_num % self._every == 0 or round_num == loop.rounds:
      loop.flush()
      self._checkpoints.save(loop.runtime.whole_state(loop.state), round_num, metrics)
      loop.saved = round_num

  def on_train_end(self, loop: Loop, completed: bool) -> None:
    # The last round every callback saw (a stop during a round's callbacks may have
    # left its row unwritten: that round is redone on resume).
    if (completed or loop.interrupted) and loop.finished > loop.saved:
      loop.flush()
      seen, row = self._last
      self._checkpoints.save(
        loop.runtime.whole_state(loop.finished_state),
        loop.finished,
        row if seen == loop.finished else None,
      )
      loop.saved = loop.finished
    self._checkpoints.close()


class FinalModel(Callback):
  """final_model.npz: the trained model's weights after the last round (`save_model`;
  `load_model` reads them back)."""

  def on_train_end(self, loop: Loop, completed: bool) -> None:
    if completed:
      outputs.save_model(
        loop.output_dir / 'final_model.npz', loop.runtime.get_model_weights(loop.state)
      )
