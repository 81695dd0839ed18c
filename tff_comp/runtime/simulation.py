"""The simulation loop: sample clients, run rounds, evaluate, write metrics.

It drives any runtime's process that takes client ids: a LearningProcess composed with
a dataset computation (TFF's runtime) or an `inprocess.InProcessProcess`
(`experiment.runner_for` makes either).

Metrics go where tools read them: `metrics.csv` (one row per round; evaluation columns
filled every `eval_period` rounds and at round 0) and TensorBoard event files under
`tensorboard/`. TFF's release managers are asynchronous and write one value tree per
call; a synchronous writer with merged train/eval rows is simpler to read and to plot.
"""

from collections.abc import Callable, Mapping
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
  """Writes per-round metrics to CSV and TensorBoard in `output_dir`."""

  def __init__(self, output_dir: pathlib.Path, columns: list[str]):
    self._columns = ['round', 'seconds'] + columns
    self._file = open(output_dir / 'metrics.csv', 'w', newline='')  # pylint: disable=consider-using-with
    self._csv = csv.DictWriter(self._file, self._columns, restval='')
    self._csv.writeheader()
    self._tb = tf.summary.create_file_writer(str(output_dir / 'tensorboard'))

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
) -> Metrics:
  """Trains `process` for `rounds` rounds; returns the last evaluation metrics.

  `process` takes client ids (`experiment.runner_for`). Client ids are sampled without
  replacement each round from a NumPy generator seeded by `seed`. `evaluate`
  maps the process state to metrics (`experiment.evaluator` builds it for a task).
  `config` is written to `config.json` beside the metrics. `learning_rates`, if given,
  sets (client, server) learning rates through the process's hparams, so one built
  process serves a whole learning-rate grid. A run already in `output_dir` is replaced
  (`experiment.check_output_dir` refuses that unless asked). `divergence_hint` ends the
  divergence message (the likely cause for the algorithm).

  Raises:
    DivergenceError: the training loss became non-finite.
  """
  output_dir.mkdir(parents=True, exist_ok=True)
  # A replaced run's event files would show in the same TensorBoard view as this one's.
  shutil.rmtree(output_dir / 'tensorboard', ignore_errors=True)
  (output_dir / 'config.json').write_text(json.dumps(dict(config), indent=2, default=str))
  rng = np.random.default_rng(seed)

  def evaluate_state(state) -> Metrics:
    return {f'eval/{k}': v for k, v in evaluate(state).items()}

  state = process.initialize()
  if learning_rates is not None:
    state = set_learning_rates(process, state, *learning_rates)
  eval_metrics = evaluate_state(state)
  writer = None
  # A live bar on a terminal; one line per evaluation in logs (CI, files).
  interactive = show_progress and sys.stderr.isatty()
  bar = tqdm.tqdm(total=rounds, disable=not interactive, file=sys.stderr,
                  unit='round', dynamic_ncols=True)
  start = time.monotonic()
  try:
    for round_num in range(1, rounds + 1):
      ids = [client_ids[i] for i in rng.choice(len(client_ids), clients_per_round, replace=False)]
      output = process.next(state, ids)
      state = output.state
      metrics = {f'train/{k}': v for k, v in flatten_metrics(output.metrics).items()}
      loss = metrics.get('train/client_work/train_loss', 0.0)
      if not math.isfinite(loss):
        raise DivergenceError(
            f'training diverged at round {round_num}: train loss {loss}; {divergence_hint}.')
      if writer is None:
        writer = MetricsWriter(output_dir, sorted(metrics) + sorted(eval_metrics))
        writer.write(0, 0.0, eval_metrics)
      if round_num % eval_period == 0 or round_num == rounds:
        eval_metrics = evaluate_state(state)
        metrics.update(eval_metrics)
        summary = {k.split('/')[-1]: f'{v:.4g}' for k, v in eval_metrics.items()}
        bar.set_postfix(summary, refresh=False)
        if show_progress and not interactive:
          elapsed = time.monotonic() - start
          print(f'round {round_num}/{rounds} ({elapsed:.1f}s): train_loss={loss:.4g} '
                + ' '.join(f'{k}={v}' for k, v in summary.items()), file=sys.stderr)
      writer.write(round_num, time.monotonic() - start, metrics)
      bar.update()
  finally:
    bar.close()
    if writer is None:  # stopped in round 1: still record the initial evaluation
      writer = MetricsWriter(output_dir, sorted(eval_metrics))
      writer.write(0, 0.0, eval_metrics)
    writer.close()
  return eval_metrics
