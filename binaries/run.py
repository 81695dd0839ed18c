r"""Runs one registered algorithm on one registered task.

    python binaries/run.py --algo=feddualavg --task=lasso
    python binaries/run.py --algo=fedprox --mu=0.1 --task=lasso --lasso_dataset=II
    python binaries/run.py --flagfile=experiments/feddualavg_lasso.flags

Writes metrics.csv, TensorBoard events and config.json to --output_dir, shows
progress, prints a summary. Bad input exits with status 2 and one line on stderr.
"""

import os

# TensorFlow's C++ start-up chatter (CUDA plugin registration) is not for users.
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')

import pathlib
import sys

if __name__ == '__main__':  # Ctrl-C from here on stops at the end of a round (below)
  from tff_comp import signals

  signals.install('run.py')

from tff_comp.binaries import flag_check

# A bad flag is reported before TensorFlow loads (when an earlier start recorded the
# flags; `flag_check`).
flag_check.check(sys.argv, flag_check.program())


from absl import app, flags
import tensorflow as tf

from tff_comp import experiment, registry, signals
from tff_comp.binaries import closed_stdout, flags_lib
from tff_comp.config import run_directory
from tff_comp.run import callbacks, outputs, training_loop
from tff_comp.runtime import workers

flags_lib.define_common_flags()
try:
  _ALGO_FLAGS, _TASK_FLAGS = flags_lib.define_plugin_flags()
except registry.RegistryError as e:  # a plugin's option clashes with another's
  flags_lib.fail(e)
FLAGS = flags.FLAGS


_fail = flags_lib.fail


@closed_stdout.closing_stdout_quietly
def main(argv: list[str]) -> None:
  """Ctrl-C or SIGTERM stop the run at the end of its round (a second one at once), with
  one line on stderr (`tff_comp.signals`)."""
  with signals.stop_at_round_end():
    try:
      _run(argv)
    except KeyboardInterrupt as e:  # a signal before the run started
      name = e.args[0] if e.args else 'SIGINT'
      print(signals.stopped_before_training('run.py', name), file=sys.stderr)
      sys.exit(signals.exit_code(name))


def _header(prepared: experiment.Prepared) -> str:
  """One line saying what runs: the algorithm, task, rounds and cohort, how clients are
  drawn, the rates, local work, the algorithm's variant choices, regularizer,
  aggregation, server optimizer and schedules (those at their defaults left out), and
  where the output goes."""
  s, config = prepared.settings, prepared.config
  steps = 0
  if prepared.algorithm.accepts('local_steps'):  # a fixed number of steps (0: epochs)
    steps = prepared.builder_args.get(
      'local_steps', next(h.default for h in prepared.algorithm.hparams if h.name == 'local_steps')
    )
  if steps:
    local = f'{steps} local steps'
  elif prepared.builder_args.get('local_epochs_max', 0) > s.local_epochs:
    local = f'{s.local_epochs}-{prepared.builder_args["local_epochs_max"]} epochs (drawn)'
  else:
    local = f'{s.local_epochs} epoch(s)'
  batch = f'batch {s.batch_size}'
  own = next((h.default for h in prepared.algorithm.hparams if h.name == 'batch_size'), None)
  if config.local_work.batch_size is None and own is not None and own != s.batch_size:
    batch += f" (task {config.task}'s; {config.algorithm} alone uses {own})"
  drawn = config.participation
  cohort = f'{s.clients_per_round} clients/round ({drawn.sampling}'
  cohort += ''.join(
    f', {label} {rate:g}'
    for label, rate in (('dropout', drawn.dropout_rate), ('stragglers', drawn.straggler_rate))
    if rate
  )
  # The algorithm's choices among its variants (ComFedL's objective, how clients are
  # weighed): its numbers are logged every round (metrics.csv's hparams/), these not.
  choices = [
    f'{h.name.replace("_", " ")} {value}'
    for h in prepared.algorithm.hparams
    if isinstance(value := prepared.builder_args.get(h.name, h.default), str)
  ]
  parts = [
    f'{s.rounds} round{"s" * (s.rounds != 1)}',
    cohort + ')',
    f'eta_c={s.client_learning_rate}',
    f'eta_s={s.server_learning_rate}',
    batch,
    local,
    *choices,
    (
      f'regularizer {s.regularizer} ({s.regularizer_strength:g})'
      if s.regularizer
      else 'no regularizer'
    ),
  ]
  aggregator = prepared.builder_args.get('model_aggregator')
  if aggregator is not None:  # its chain's stages and combiner, or a private mean's kind
    parts.append(f'aggregator {aggregator.name}')
  if config.server.server_optimizer:
    parts.append(f'server optimizer {config.server.server_optimizer}')
  for side, schedule in (
    ('client', config.schedules.client_lr_schedule),
    ('server', config.schedules.server_lr_schedule),
  ):
    if schedule != 'constant':
      parts.append(f'{side} rate {schedule}')
  return f'{config.algorithm} on {config.task}: {", ".join(parts)}; output: {config.output_dir}'


def _run(argv: list[str]) -> None:
  flags_lib.quiet_logs()
  if len(argv) > 1:
    _fail(f'unexpected arguments: {" ".join(argv[1:])}')
  try:
    config = flags_lib.config_from_flags(FLAGS, _ALGO_FLAGS, _TASK_FLAGS)
    prepared = experiment.prepare(config)
  except (registry.RegistryError, experiment.ConfigError) as e:
    _fail(str(e))
  config = prepared.config  # its task and output directory resolved
  signals.stop_if_requested()  # a signal while the task was built: nothing written yet
  print(_header(prepared), flush=True)
  try:
    runner = experiment.build_runner(prepared)
    signals.stop_if_requested()
    final = experiment.train_runner(
      prepared, runner, callbacks=experiment.default_callbacks(prepared, runner)
    )
  except (experiment.ConfigError, callbacks.DivergenceError) as e:
    _fail(str(e))
  except workers.WorkerError as e:  # a worker died during the run
    print(
      f'run.py: {e} The metrics written so far are in {config.output_dir}; continue with --resume.',
      file=sys.stderr,
    )
    sys.exit(1)
  except (OSError, tf.errors.OpError) as e:  # a full disk, a quota, ulimit -f
    if not (line := run_directory.out_of_space(e, config.output_dir)):
      raise
    print(f'run.py: {line}', file=sys.stderr)
    sys.exit(1)
  except training_loop.Interrupted as e:  # Ctrl-C or SIGTERM, at the end of a round
    sigterm = 'SIGTERM' in getattr(e.__cause__, 'args', ())
    saved = getattr(e, 'saved_round', 0)
    print(
      f'run.py: {"terminated (SIGTERM)" if sigterm else "interrupted"}; '
      + (
        f'saved the state of round {saved}, --resume continues from it'
        if saved
        else 'no round was saved'
      )
      + f'; the metrics written so far are in {config.output_dir}',
      file=sys.stderr,
    )
    sys.exit(143 if sigterm else 130)
  tables = {'final evaluation': {k.removeprefix('eval/'): v for k, v in final.items()}}
  if prepared.ledger is not None:  # the budget spent, as the last row recorded it
    _, rows, _ = outputs.whole_rows(pathlib.Path(config.output_dir) / 'metrics.csv')
    spent = [float(r['privacy/epsilon']) for r in rows if r.get('privacy/epsilon')]
    if spent:
      tables['privacy spent'] = {'epsilon': spent[-1], 'delta': prepared.ledger.delta}
  if prepared.task.reference is not None and FLAGS.show_reference:
    tables['centralized reference'] = prepared.task.reference()
  width = max(len(key) for table in tables.values() for key in table)
  for title, table in tables.items():  # one width for both: the values line up
    print(f'{title}:')
    for key, value in table.items():
      print(f'  {key:>{width}s} {value:.6g}')


flags.DEFINE_bool('show_reference', True, "Also print the task's centralized reference solution.")

if __name__ == '__main__':
  app.run(main, flags_parser=flags_lib.parse_or_fail)
