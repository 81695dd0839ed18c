"""binaries/run.py end to end in a subprocess: outputs, flags, bad input, no leftover worker."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests import workers

ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3')


def _run(repo_root, *args, timeout=300):
  return subprocess.run(
      [sys.executable, str(repo_root / 'binaries' / 'run.py'), *args],
      capture_output=True, text=True, timeout=timeout, env=ENV, cwd=repo_root,
      stdin=subprocess.DEVNULL)


def test_default_algorithm_run_writes_metrics_and_leaves_no_worker(repo_root, tmp_path):
  before = set(workers.worker_pids())
  out = _run(repo_root, '--algo=fedavg', '--task=lasso', '--rounds=4', '--eval_period=2',
             f'--output_dir={tmp_path}')
  assert out.returncode == 0, out.stderr
  assert 'final evaluation:' in out.stdout and 'f1' in out.stdout
  assert 'round 4/4' in out.stderr  # progress, one line per evaluation off a terminal
  header, *rows = (tmp_path / 'metrics.csv').read_text().splitlines()
  assert header.startswith('round,seconds,') and 'eval/f1' in header
  assert 'train/client_work/train_loss' in header
  assert len(rows) == 5
  assert list((tmp_path / 'tensorboard').glob('events.out.tfevents.*'))
  config = json.loads((tmp_path / 'config.json').read_text())
  assert config['algorithm'] == 'fedavg' and config['resolved']['client_learning_rate'] == 1e-3
  assert not set(workers.wait_for_exit(exclude=before))


def test_flagfile_and_algorithm_and_task_flags(repo_root, tmp_path):
  flagfile = tmp_path / 'exp.flags'
  flagfile.write_text(
      '--algo=fedprox\n--mu=0.1\n--task=lasso\n--lasso_dataset=III\n--rounds=2\n'
      f'--clients_per_round=3\n--output_dir={tmp_path / "out"}\n')
  out = _run(repo_root, f'--flagfile={flagfile}')
  assert out.returncode == 0, out.stderr
  config = json.loads((tmp_path / 'out' / 'config.json').read_text())
  assert config['algorithm_options'] == {'mu': 0.1}
  assert config['task_options'] == {'dataset': 'III'}


BAD_INPUT = [
    (['--algo=fedavgg'], "unknown algorithm 'fedavgg'. Did you mean 'fedavg'?"),
    (['--task=lassoo'], "unknown task 'lassoo'"),
    (['--client_learning_rate=0'], '--client_learning_rate must be > 0'),
    (['--server_learning_rate=-1'], '--server_learning_rate must be > 0'),
    (['--rounds=0'], '--rounds must be >= 1'),
    (['--clients_per_round=0'], '--clients_per_round must be >= 1'),
    (['--clients_per_round=65'], 'exceeds the 64 clients'),
    (['--algo=fedavg', '--mu=0.1'], "--mu does not apply to algorithm 'fedavg'"),
    (['--algo=fedavg', '--regularizer=l1'], 'ignores regularizers'),
    (['--regularizer_strength=-0.5'], '--regularizer_strength must be >= 0'),
    (['--regularizer=nuclear'], 'needs a matrix'),
    (['--algo=fedprox', '--mu=-1'], 'mu must be >= 0'),
    (['--lasso_dataset=V'], "dataset='V' is unknown"),
    (['stray'], 'unexpected arguments: stray'),
    (['--algo=ditto', '--task=sinewave'], "task 'sinewave' cannot evaluate them"),
]


@pytest.mark.parametrize('args,message', BAD_INPUT, ids=[' '.join(a) for a, _ in BAD_INPUT])
def test_bad_input_is_one_line_and_exit_2(repo_root, args, message):
  out = _run(repo_root, *args, '--output_dir=/nonexistent/never-written')
  assert out.returncode == 2, (out.stdout, out.stderr)
  lines = out.stderr.strip().splitlines()
  assert len(lines) == 1, out.stderr
  assert message in lines[0]
  assert 'Traceback' not in out.stderr


def test_unknown_algorithm_lists_valid_names(repo_root):
  out = _run(repo_root, '--algo=nope')
  assert out.returncode == 2
  assert 'feddualavg' in out.stderr and 'fedmid_osp' in out.stderr


def test_sigterm_during_training_leaves_no_worker(repo_root, tmp_path):
  proc = subprocess.Popen(
      [sys.executable, str(repo_root / 'binaries' / 'run.py'), '--rounds=100000',
       '--runtime=tff', f'--output_dir={tmp_path}'],
      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV, cwd=repo_root)
  try:
    deadline = time.monotonic() + 120
    while not workers.workers_of(proc.pid) and time.monotonic() < deadline:
      time.sleep(0.2)
    started = workers.workers_of(proc.pid)
    assert started, 'run.py never started a worker'
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
  finally:
    proc.kill()  # never leave a 100000-round run behind, whatever failed
  assert not set(started) & set(workers.wait_for_exit())


def test_divergence_is_one_line_and_keeps_initial_metrics(repo_root, tmp_path):
  out = _run(repo_root, '--algo=fedavg', '--client_learning_rate=1e6', '--rounds=5',
             f'--output_dir={tmp_path}')
  assert out.returncode == 2
  lines = out.stderr.strip().splitlines()
  assert 'diverged at round' in lines[-1] and 'Traceback' not in out.stderr
  rows = (tmp_path / 'metrics.csv').read_text().splitlines()
  assert rows[1].startswith('0,')  # the initial evaluation is kept


def test_default_runtime_is_inprocess_and_starts_no_worker(repo_root, tmp_path):
  out = _run(repo_root, '--algo=fedavg', '--rounds=2', f'--output_dir={tmp_path}')
  assert out.returncode == 0, out.stderr
  assert 'runtime: inprocess on /device:CPU:0' in out.stdout
  assert json.loads((tmp_path / 'config.json').read_text())['resolved']['runtime'].startswith(
      'inprocess')


def test_custom_aggregation_falls_back_to_tff_saying_why():
  """A process the in-process runtime cannot run goes to TFF's, with the reason."""
  from tff_comp import experiment, models, registry  # pylint: disable=g-import-not-at-top
  import tff_comp.algorithms  # pylint: disable=g-import-not-at-top,unused-import
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  from tff_comp.tasks import array_data  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  data = array_data.cached_client_data(
      'fallback', ['a', 'b'], (2,), tf.float32,
      lambda i: (np.ones((3, 2), np.float32) * i, np.ones(3, np.float32)))
  process = registry.get_algorithm('fedavg').build(
      models.linear_regression((2,)), client_learning_rate=0.1,
      model_aggregator=tff.learning.robust_aggregator(zeroing=False))
  _, chosen = experiment.runner_for(process, data, 'auto')
  assert chosen.startswith('tff (not in-process: a custom model_aggregator')
  with pytest.raises(experiment.ConfigError, match='--runtime=inprocess: a custom'):
    experiment.runner_for(process, data, 'inprocess')
