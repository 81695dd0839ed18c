"""The simulation loop: sample clients, run rounds, evaluate, write metrics.

It drives any `runtime.base.Runtime` (`choice.runner_for` builds one).

Metrics go where tools read them: `metrics.csv` (one row per round; evaluation columns
filled every `eval_period` rounds and at round 0) and TensorBoard event files under
`tensorboard/`, buffered off the round's path (`MetricsWriter`). TFF's release managers
write one value tree per call; one merged train/eval row per round is simpler to read,
to plot and to cut back on resume.
"""

from collections.abc import Callable, Mapping, Sequence
import pathlib
import shutil
import time
from typing import Any

from absl import logging

from tff_comp import signals
from tff_comp.run import callbacks as callbacks_lib
from tff_comp.run import checkpoints as checkpoints_lib
from tff_comp.run import outputs, sampling
from tff_comp.runtime import base
from tff_comp.settings import ConfigError


class Interrupted(KeyboardInterrupt):
  """The run stopped on Ctrl-C or SIGTERM; the state of round `saved_round` is saved
  (0: nothing saved), and `--resume` continues from it."""

  def __init__(self, saved_round: int):
    super().__init__(saved_round)
    self.saved_round = saved_round


class SignalStop(callbacks_lib.Callback):
  """Ends the run after the round in which Ctrl-C or SIGTERM arrived (`tff_comp.signals`),
  as an interrupted run (its state saved), or before its first round when one arrived
  while it started. Last in the list."""

  def before_round(self, loop: callbacks_lib.Loop, round_num: int, clients) -> None:
    signals.stop_if_requested()

  def after_round(self, loop: callbacks_lib.Loop, round_num: int, metrics: outputs.Metrics) -> None:
    name = signals.requested()
    if name:
      raise callbacks_lib.StopTraining(name, interrupt=True)


def _start_fresh(loop: callbacks_lib.Loop, checkpoints: checkpoints_lib.Checkpoints) -> None:
  """A fresh run in `loop.output_dir`: nothing of a replaced run may be resumed later."""
  checkpoints.clear()
  shutil.rmtree(loop.output_dir / 'checkpoints_damaged', ignore_errors=True)
  shutil.rmtree(loop.output_dir / 'clients', ignore_errors=True)
  (loop.output_dir / 'final_model.npz').unlink(missing_ok=True)


def _restore(loop: callbacks_lib.Loop, checkpoints: checkpoints_lib.Checkpoints) -> None:
  """Continues the run in `loop.output_dir` from its newest readable checkpoint whose
  round's metrics.csv rows are whole (rows 0 to it): the state and those rows (the
  sampler draws by round); the rounds after it are run again. Nothing saved: a fresh
  run.

  Raises:
    ConfigError: checkpoints are saved but metrics.csv lost the rows up to every one of
      them (deleted, cut, damaged): never resumed without them, nothing deleted; or
      the newest is of another layout of the state (`checkpoints.OtherLayout`).
  """
  saved_rounds = checkpoints.rounds()
  if not saved_rounds:
    _start_fresh(loop, checkpoints)
    return
  path = loop.output_dir / 'metrics.csv'
  columns, rows, problem = outputs.whole_rows(path) if path.exists() else ([], [], '')
  try:
    state, done = checkpoints.load_latest(loop.state, up_to=len(rows) - 1, rows=rows)
  except checkpoints_lib.OtherLayout as e:
    raise ConfigError(
      f'--resume: {e}; it cannot be resumed. Start the run over with --overwrite.'
    ) from e
  if state is None and checkpoints.rounds():
    what = (
      'is missing'
      if not path.exists()
      else f'is whole up to round {len(rows) - 1} only ({problem})'
      if rows
      else f'is without a whole row ({problem or "no row"})'
    )
    raise ConfigError(
      f'--resume: {path} {what}: the metrics of the saved rounds'
      f' ({", ".join(map(str, checkpoints.rounds()))}) are lost. Restore the file, or'
      ' start the run over with --overwrite.'
    )
  if state is None:  # every checkpoint was damaged (set aside)
    _start_fresh(loop, checkpoints)
    return
  if done < saved_rounds[-1]:
    logging.warning(
      '%s is whole up to round %d only (%s); resuming from the checkpoint of'
      ' round %d, the rounds after it run again.',
      path,
      len(rows) - 1,
      problem or 'it ends there',
      done,
    )
  loop.state, loop.done = state, done
  loop.kept_columns, loop.kept_rows = columns, rows[: done + 1]
  loop.start -= float(loop.kept_rows[-1]['seconds'] or 0.0)


def run_loop(
  runtime,
  loop: callbacks_lib.Loop,
  sampler: sampling.ClientSampler,
  callbacks: list[callbacks_lib.Callback],
) -> None:
  """The loop: rounds `loop.done + 1 .. loop.rounds` on the sampler's clients, each
  round's metrics (`train/...`, `participation/...`, `hparams/...`, `server/...`,
  `seconds_per_round`: the round's training, from its `before_round` to its metrics on
  the host) handed to the callbacks in order. A round where no sampled client reports
  leaves the state as it was (logged; no train/ metrics)."""
  # Each round is drawn once: the draw of round r + 1 is read ahead (`loop.upcoming`,
  # which a callback may prefetch) and used by round r + 1.
  loop.upcoming = sampler.sample(loop.done + 1) if loop.done < loop.rounds else None
  # Set before the first round; read once, logged every round (on TFF's runtime reading
  # them is a computation call); a callback changing them updates `loop.hparams`.
  loop.hparams = callbacks_lib.hparam_metrics(runtime, loop.state)
  for callback in callbacks:
    callback.on_train_begin(loop)
  completed, stop = False, None
  try:
    for round_num in range(loop.done + 1, loop.rounds + 1):
      start = time.perf_counter()
      clients = loop.upcoming
      assert clients is not None  # sampled for every round up to loop.rounds
      loop.upcoming = sampler.sample(round_num + 1) if round_num < loop.rounds else None
      for callback in callbacks:
        callback.before_round(loop, round_num, clients)
      metrics = clients.metrics()
      if clients.reporting or clients.steps:
        output = runtime.next(loop.state, list(clients.reporting), clients.work)
        loop.state = output.state
        metrics.update(
          {f'train/{k}': v for k, v in outputs.flatten_metrics(output.metrics).items()}
        )
      else:
        logging.warning(
          'round %d: none of the %d sampled clients reported; the model is unchanged.',
          round_num,
          len(clients.sampled),
        )
      loop.round_num = round_num
      metrics.update(loop.hparams)
      metrics.update(callbacks_lib.server_quantities(loop.state))
      metrics['seconds_per_round'] = time.perf_counter() - start
      for callback in callbacks:
        try:
          callback.after_round(loop, round_num, metrics)
        except callbacks_lib.StopTraining as request:  # the callbacks after it still see this round
          stop = request if stop is None or request.interrupt else stop
      loop.finished, loop.finished_state = round_num, loop.state
      if stop is not None and stop.interrupt:
        raise KeyboardInterrupt(*stop.args)
      if stop is not None:
        break
    completed = True
  except KeyboardInterrupt:
    loop.interrupted = True
    raise
  finally:
    for callback in callbacks:
      callback.on_train_end(loop, completed)


def standard_callbacks(
  evaluate: Callable[[Any], outputs.Metrics],
  *,
  eval_period: int,
  evaluate_clients: Callable[[Any], list[dict[str, Any]]] | None = None,
  divergence_hint: str = 'try a smaller learning rate',
  schedules: tuple[Any, Any] | None = None,
  show_progress: bool = True,
  extra: Sequence[callbacks_lib.Callback] = (),
  progress_also: Sequence[str] = (),
) -> list[callbacks_lib.Callback]:
  """The callbacks of a standard run, in order: the learning-rate `schedules` (client,
  server; `schedules.Schedule`s, left out when both are constant), a divergence guard on
  the training loss (its message ending with `divergence_hint`), the evaluator
  (`evaluate` maps the state to metrics at the start, every `eval_period` rounds and at
  the last; `evaluate_clients` to one row per client), a guard on the evaluation's loss,
  `extra`, and the progress line (with the columns `progress_also` where written).
  `run_simulation` adds the run directory's own."""
  scheduled = (
    []
    if schedules is None or all(s.constant for s in schedules)
    else [callbacks_lib.Schedules(*schedules)]
  )
  return [
    *scheduled,
    callbacks_lib.DivergenceGuard(divergence_hint),
    callbacks_lib.Evaluator(evaluate, eval_period, evaluate_clients),
    callbacks_lib.DivergenceGuard(divergence_hint, evaluated=True),
    *extra,
    callbacks_lib.Progress(show_progress, progress_also),
  ]


def _resuming(done: int, rounds: int, begun: bool) -> str:
  """The line a resumed run starts with: where from (`begun`: the directory held a run),
  and that a finished run has nothing left (its final evaluation follows)."""
  if not done:
    if not begun:
      return 'resuming: no run here yet, starting from round 0'
    return 'resuming: no checkpoint was saved, starting from round 0'
  if done >= rounds:
    return (
      f'resuming from round {done}: the run had reached its {rounds} rounds'
      ' (a larger --rounds extends it)'
    )
  return f'resuming from round {done}'


def run_simulation(
  runtime: base.Runtime,
  *,
  client_ids: list[str],
  rounds: int,
  clients_per_round: int,
  seed: int,
  output_dir: pathlib.Path,
  config: Mapping[str, Any],
  callbacks: Sequence[callbacks_lib.Callback],
  show_progress: bool = True,
  learning_rates: tuple[float, float] | None = None,
  client_hparams: Mapping[str, float] | None = None,
  checkpoints: checkpoints_lib.CheckpointOptions = checkpoints_lib.CheckpointOptions(),  # noqa: B008 (a frozen record)
  resume: bool = False,
  participation: sampling.Participation = sampling.Participation(),  # noqa: B008 (a frozen record)
  sampler: Any = None,
) -> outputs.Metrics:
  """Trains `runtime` (`choice.runner_for` builds one) for `rounds` rounds with
  `callbacks` (composed by the caller: `standard_callbacks` gives a standard run's);
  returns the last evaluation (an `Evaluator`'s; {} without one). Each round's clients
  are drawn as `participation` says (`ClientSampler`, seeded by `seed`), or by
  `sampler`, any object with `sample(round_num) -> sampling.RoundClients` and a
  `capacity`. `config` is written to `config.json` beside the metrics.
  `learning_rates`, if given, sets (client, server) learning rates through the hparams,
  and `client_hparams` the client work's other hparams by name, so one built runtime
  serves a whole grid. A run already in `output_dir` is replaced
  (`run_directory.check_output_dir` refuses that unless asked), or with `resume`
  continued from its last checkpoint: the state is saved as `checkpoints` says
  (`CheckpointOptions`: every `checkpoint_every` rounds) and at the last round,
  sampling depends on the round only, and the rows after the
  checkpoint are dropped, so a resumed run ends exactly as an uninterrupted one (its
  caller checks that the configuration matches). The final model's trainable weights
  go to `final_model.npz`.

  The run directory's guarantees are the loop's own callbacks, around the caller's:
  the cohort reader first; then the metrics sink (what the callbacks add to a round's
  metrics is written), the run record, checkpoints, the final model, and the
  Ctrl-C/SIGTERM stop last.

  Raises:
    callbacks_lib.DivergenceError: the training loss became non-finite.
    Interrupted: Ctrl-C or SIGTERM (at the end of the round with `tff_comp.signals`);
      the last finished round is saved first.
  """
  output_dir.mkdir(parents=True, exist_ok=True)
  for (
    prefix
  ) in outputs.TEMPORARY_PREFIXES:  # what a killed run was writing (this run holds the lock)
    for stale in output_dir.glob(f'{prefix}*'):
      stale.unlink(missing_ok=True)
  saved = checkpoints_lib.Checkpoints(output_dir, checkpoints)
  sampler = sampler or sampling.ClientSampler(client_ids, clients_per_round, seed, participation)
  loop = callbacks_lib.Loop(runtime, output_dir, rounds)
  loop.state = runtime.initialize()
  if learning_rates is not None:
    loop.state = callbacks_lib.set_learning_rates(
      runtime, loop.state, *learning_rates, client_hparams
    )
  loop.initial_hparams = runtime.get_hparams(loop.state)
  if resume:
    begun = (output_dir / 'metrics.csv').exists()
    _restore(loop, saved)
    if show_progress:
      print(_resuming(loop.done, rounds, begun), flush=True)
  else:
    _start_fresh(loop, saved)
  try:
    run_loop(
      runtime,
      loop,
      sampler,
      [
        callbacks_lib.CohortReader(sampler.capacity),
        *callbacks,
        callbacks_lib.MetricsSink(),
        callbacks_lib.RunRecord(config),
        callbacks_lib.Checkpointer(saved),
        callbacks_lib.FinalModel(),
        SignalStop(),
      ],
    )
  except KeyboardInterrupt as interrupt:
    raise Interrupted(loop.saved) from interrupt
  return loop.eval_metrics
