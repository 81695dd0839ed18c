"""The simulation loop: sample clients, run rounds, evaluate, write metrics.

It drives any `runtime.base.Runtime` (`experiment.runner_for` builds one).

Metrics go where tools read them: `metrics.csv` (one row per round; evaluation columns
filled every `eval_period` rounds and at round 0) and TensorBoard event files under
`tensorboard/`. TFF's release managers are asynchronous and write one value tree per
call; a synchronous writer with merged train/eval rows is simpler to read and to plot.
"""

from collections.abc import Callable, Mapping
import asyncio
import csv
import json
import math
import pathlib
import shutil
import sys
import time
from typing import Any

import numpy as np
import tensorflow as tf
import tqdm

from tff_comp.runtime import base

Metrics = dict[str, float]


class DivergenceError(RuntimeError):
  """Training produced a non-finite loss."""


def flatten_metrics(tree: Any, prefix: str = '') -> Metrics:
  """Nested OrderedDicts of scalars -> {'a/b/c': float}; empty leaves dropped."""
  flat = {}
  if isinstance(tree, Mapping):
    for key, value in tree.items():
      flat.update(flatten_metrics(value, f'{prefix}{key}/'))
  elif not isinstance(tree, (tuple, list)):
    flat[prefix.rstrip('/')] = float(np.asarray(tree))
  return flat


class MetricsWriter:
  """Writes per-round metrics to CSV and TensorBoard in `output_dir`.

  `kept_rows`: rows of an interrupted run to keep (a resumed run continues after
  them); the CSV and the TensorBoard events are rewritten from them, so neither holds
  a round twice nor a round the resumed run will redo.
  """

  def __init__(self, output_dir: pathlib.Path, columns: list[str],
               kept_rows: list[dict[str, str]] | None = None):
    self._columns = ['round', 'seconds'] + columns
    self._file = open(output_dir / 'metrics.csv', 'w', newline='')  # pylint: disable=consider-using-with
    self._csv = csv.DictWriter(self._file, self._columns, restval='')
    self._csv.writeheader()
    shutil.rmtree(output_dir / 'tensorboard', ignore_errors=True)
    self._tb = tf.summary.create_file_writer(str(output_dir / 'tensorboard'))
    for row in kept_rows or []:
      self.write(int(row['round']), float(row['seconds']),
                 {k: float(v) for k, v in row.items() if k not in ('round', 'seconds') and v})

  def write(self, round_num: int, seconds: float, metrics: Metrics) -> None:
    self._csv.writerow(
        {'round': round_num, 'seconds': f'{seconds:.4f}',
         **{k: v for k, v in metrics.items() if k in self._columns}}
    )
    self._file.flush()
    with self._tb.as_default():
      for key, value in metrics.items():
        tf.summary.scalar(key, value, step=round_num)
    self._tb.flush()

  def close(self) -> None:
    self._file.close()
    self._tb.close()


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


def _write_config(output_dir: pathlib.Path, config: Mapping[str, Any], runtime) -> None:
  """config.json: the run's configuration and what its runtime records (name, engine,
  device, why; `runtime.base.Runtime.record`)."""
  config = dict(config, runtime_record=getattr(runtime, 'record', None))
  if 'resolved' in config and hasattr(runtime, 'description'):
    config['resolved'] = dict(config['resolved'], runtime=runtime.description)
  (output_dir / 'config.json').write_text(json.dumps(config, indent=2, default=str))


class Checkpoints:
  """The process state every few rounds, with TFF's `FileProgramStateManager` (in
  `output_dir/checkpoints`, the last two kept). The state is saved as NumPy values and
  restored into the structure of a fresh `process.initialize()`."""

  def __init__(self, output_dir: pathlib.Path):
    import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

    self._manager = tff.program.FileProgramStateManager(
        output_dir / 'checkpoints', keep_total=2, keep_first=False)
    # A private loop: asyncio.run would unset the thread's event loop, which TFF's
    # execution contexts read.
    self._loop = asyncio.new_event_loop()

  def _run(self, coroutine):
    return self._loop.run_until_complete(coroutine)

  def close(self) -> None:
    self._loop.close()

  def clear(self) -> None:
    self._run(self._manager.remove_all())

  def save(self, state, round_num: int) -> None:
    self._run(self._manager.save(tf.nest.map_structure(np.asarray, state), round_num))

  def load_latest(self, template) -> tuple[Any, int]:
    """(state, round) of the newest readable checkpoint, or (None, 0). A checkpoint
    cut short by a kill is skipped for the one before it."""
    template = tf.nest.map_structure(np.asarray, template)
    for version in sorted(self._run(self._manager.get_versions()) or [], reverse=True):
      try:
        return self._run(self._manager.load(version, template)), version
      except Exception:  # pylint: disable=broad-except  (any damage: try an older one)
        continue
    return None, 0


# Server-state tables up to this many entries are logged entry by entry (AFL's and
# TR-MAML's client weights); larger ones (Ditto's personal models) are not.
_MAX_LOGGED_TABLE = 100


def hparam_metrics(process, state) -> Metrics:
  """The hyperparameters in force (`hparams/...`, learning rates included)."""
  return {f'hparams/{k}': v for k, v in flatten_metrics(process.get_hparams(state)).items()}


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
                       server_learning_rate: float):
  """Returns `state` with the client work's and server update's learning rates set.

  A server update without a learning rate (q-FedAvg's ratio step) accepts only 1.
  """
  hparams = process.get_hparams(state)
  hparams['client_work']['learning_rate'] = np.float32(client_learning_rate)
  if 'learning_rate' in hparams['server_update']:
    hparams['server_update']['learning_rate'] = np.float32(server_learning_rate)
  elif server_learning_rate != 1.0:
    raise ValueError('this process has no server learning rate to set.')
  return process.set_hparams(state, hparams)


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
    divergence_hint: str = 'try a smaller learning rate',
    checkpoint_every: int = 50,
    resume: bool = False,
    evaluate_clients: Callable[[Any], list[dict[str, Any]]] | None = None,
) -> Metrics:
  """Trains `process` for `rounds` rounds; returns the last evaluation metrics.

  `process` takes client ids (`experiment.runner_for`). Client ids are sampled without
  replacement each round from a NumPy generator seeded by `seed`. `evaluate`
  maps the process state to metrics (`experiment.evaluator` builds it for a task).
  `config` is written to `config.json` beside the metrics. `learning_rates`, if given,
  sets (client, server) learning rates through the process's hparams, so one built
  process serves a whole learning-rate grid. A run already in `output_dir` is replaced
  (`experiment.check_output_dir` refuses that unless asked), or with `resume`
  continued from its last checkpoint: the state is saved every `checkpoint_every`
  rounds and at the last one, the sampler is replayed, and the rows after the
  checkpoint are dropped, so a resumed run ends exactly as an uninterrupted one (its
  caller checks that the configuration matches). The final model's trainable weights
  go to `final_model.npz`. `divergence_hint` ends the divergence message (the likely
  cause for the algorithm). `evaluate_clients`, if given, maps the state to one row
  per client, written at every evaluation to `clients/eval_round_<r>.csv`.

  Raises:
    DivergenceError: the training loss became non-finite.
  """
  output_dir.mkdir(parents=True, exist_ok=True)
  checkpoints = Checkpoints(output_dir)
  rng = np.random.default_rng(seed)

  def evaluate_state(state, round_num: int) -> Metrics:
    if evaluate_clients is not None:
      write_client_rows(output_dir / 'clients' / f'eval_round_{round_num:05d}.csv',
                        evaluate_clients(state))
    return {f'eval/{k}': v for k, v in evaluate(state).items()}

  def sample() -> list[str]:
    return [client_ids[i] for i in rng.choice(len(client_ids), clients_per_round, replace=False)]

  state = process.initialize()
  if learning_rates is not None:
    state = set_learning_rates(process, state, *learning_rates)
  done, writer, offset = 0, None, 0.0
  if resume and (output_dir / 'metrics.csv').exists():
    saved, done = checkpoints.load_latest(state)
    if saved is not None:
      state = saved
      columns, rows = _read_rows(output_dir / 'metrics.csv', done)
      writer = MetricsWriter(output_dir, columns, kept_rows=rows)
      offset = float(rows[-1]['seconds']) if rows else 0.0
      for _ in range(done):  # the sampler where the checkpoint left it
        sample()
  if writer is None:  # a fresh run: nothing of a replaced run may be resumed later
    done = 0
    checkpoints.clear()
    shutil.rmtree(output_dir / 'clients', ignore_errors=True)
    (output_dir / 'final_model.npz').unlink(missing_ok=True)
    _write_config(output_dir, config, process)
  eval_metrics = evaluate_state(state, done)
  # Set before the first round and unchanged after it: read once, logged every round
  # (on TFF's runtime reading them is a computation call).
  hparams = hparam_metrics(process, state)
  # A live bar on a terminal; one line per evaluation in logs (CI, files).
  interactive = show_progress and sys.stderr.isatty()
  bar = tqdm.tqdm(total=rounds, initial=done, disable=not interactive, file=sys.stderr,
                  unit='round', dynamic_ncols=True)
  start = time.monotonic() - offset
  previous = offset  # seconds at the end of the last round
  try:
    for round_num in range(done + 1, rounds + 1):
      output = process.next(state, sample())
      state = output.state
      metrics = {f'train/{k}': v for k, v in flatten_metrics(output.metrics).items()}
      metrics.update(hparams)
      metrics.update(server_quantities(state))
      metrics['seconds_per_round'] = time.monotonic() - start - previous
      loss = metrics.get('train/client_work/train_loss', 0.0)
      if not math.isfinite(loss):
        raise DivergenceError(
            f'training diverged at round {round_num}: train loss {loss}; {divergence_hint}.')
      if writer is None:
        writer = MetricsWriter(output_dir, sorted(metrics) + sorted(eval_metrics))
        writer.write(0, 0.0, eval_metrics)
      if round_num % eval_period == 0 or round_num == rounds:
        eval_metrics = evaluate_state(state, round_num)
        metrics.update(eval_metrics)
        summary = {k.split('/')[-1]: f'{v:.4g}' for k, v in eval_metrics.items()}
        bar.set_postfix(summary, refresh=False)
        if show_progress and not interactive:
          elapsed = time.monotonic() - start
          # The round's loss at the visited iterates, then the evaluation's metrics
          # (a task's own `train_loss` is its evaluation on the pooled training data).
          print(f'round {round_num}/{rounds} ({elapsed:.1f}s): round_loss={loss:.4g} '
                + ' '.join(f'{k}={v}' for k, v in summary.items()), file=sys.stderr)
      previous = time.monotonic() - start
      writer.write(round_num, previous, metrics)
      if round_num == done + 1:  # the engine actually used, after a first-round fallback
        _write_config(output_dir, config, process)
      if round_num % checkpoint_every == 0 or round_num == rounds:
        checkpoints.save(state, round_num)
      bar.update()
  finally:
    bar.close()
    if writer is None:  # stopped in round 1: still record the initial evaluation
      writer = MetricsWriter(output_dir, sorted(eval_metrics))
      writer.write(0, 0.0, eval_metrics)
    writer.close()
    checkpoints.close()
  np.savez(output_dir / 'final_model.npz',
           *tf.nest.map_structure(np.asarray, process.get_model_weights(state).trainable))
  return eval_metrics
