"""binaries/run.py end to end in a subprocess: outputs, flags, bad input, no leftover worker."""

import csv
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import pytest

from tests import cli_driver, workers

ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3')


def _run(repo_root, *args, timeout=300):
  return subprocess.run(
    [sys.executable, str(repo_root / 'binaries' / 'run.py'), *args],
    capture_output=True,
    text=True,
    timeout=timeout,
    env=ENV,
    cwd=repo_root,
    stdin=subprocess.DEVNULL,
  )


def _start(repo_root, *args, **kwargs):
  return subprocess.Popen(
    [sys.executable, str(repo_root / 'binaries' / 'run.py'), *args],
    text=True,
    env=ENV,
    cwd=repo_root,
    stdin=subprocess.DEVNULL,
    **kwargs,
  )


def test_default_run_is_inprocess_writes_metrics_and_leaves_no_worker(repo_root, tmp_path):
  proc = _start(
    repo_root,
    '--algo=fedavg',
    '--task=lasso',
    '--rounds=4',
    '--eval_period=2',
    f'--output_dir={tmp_path}',
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
  )
  started = set()
  try:
    while proc.poll() is None:  # the in-process runtime starts no TFF worker
      started.update(workers.workers_of(proc.pid))
      time.sleep(0.1)
    stdout, stderr = proc.communicate(timeout=60)
  finally:
    proc.kill()
  out = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
  assert out.returncode == 0, out.stderr
  assert not started
  assert 'runtime: inprocess on /device:CPU:0' in out.stdout
  assert 'final evaluation:' in out.stdout and 'f1' in out.stdout
  assert 'round 4/4' in out.stderr  # progress, one line per evaluation off a terminal
  header, *rows = (tmp_path / 'metrics.csv').read_text().splitlines()
  assert header.startswith('round,seconds,') and 'eval/f1' in header
  assert 'train/client_work/train_loss' in header
  assert len(rows) == 5
  assert list((tmp_path / 'tensorboard').glob('events.out.tfevents.*'))
  config = json.loads((tmp_path / 'config.json').read_text())
  assert config['algorithm'] == 'fedavg' and config['resolved']['client_learning_rate'] == 1e-3
  assert config['resolved']['runtime'].startswith('inprocess')


BAD_INPUT = [
  (['--algo=fedavgg'], "unknown algorithm 'fedavgg'. Did you mean 'fedavg'?"),
  (['--task=lassoo'], "unknown task 'lassoo'"),
  (['--task=LASSO'], "unknown task 'LASSO'. Did you mean 'lasso'?"),
  (['--client_learning_rate=0'], '--client_learning_rate must be > 0'),
  (['--server_learning_rate=-1'], '--server_learning_rate must be > 0'),
  (['--rounds=0'], '--rounds must be >= 1'),
  (['--aggregator=dp', '--clip_norm=1'], '--noise_multiplier or --target_epsilon'),
  (
    ['--aggregator=dp', '--clip_norm=1', '--target_epsilon=1', '--target_delta=0.5'],
    'target_delta must be in',
  ),
  (['--noise_multiplier=1'], 'add --aggregator=clip, dp, dp_adaptive'),
  (['--aggregator=medain'], 'flag --aggregator=medain: value should be one of'),
  (
    [
      '--aggregator=dp',
      '--clip_norm=1',
      '--noise_multiplier=1',
      '--algo=afl',
      '--task=dominant_class',
    ],
    'per-client weights',
  ),
  (['--clients_per_round=0'], '--clients_per_round must be >= 1'),
  (['--clients_per_round=65'], 'exceeds the 64 clients'),
  (['--algo=fedavg', '--mu=0.1'], "--mu does not apply to algorithm 'fedavg'"),
  (['--algo=fedavg', '--regularizer=l1'], 'ignores regularizers'),
  (['--regularizer_strength=-0.5'], '--regularizer_strength must be >= 0'),
  (['--regularizer=nuclear'], 'needs a matrix'),
  (['--algo=fedprox', '--mu=-1'], 'mu must be >= 0'),
  (['--lasso_dataset=V'], 'flag --lasso_dataset=V: value should be one of <I|II|III|IV>'),
  (
    ['--task=emnist', '--emnist_source=synthetic', '--model=tiny_cnn'],
    "unknown model 'tiny_cnn'. This task's own: softmax, cnn, cnn_dropout; registered: none",
  ),
  (['stray'], 'unexpected arguments: stray'),
  (['--algo=ditto', '--task=sinewave'], "task 'sinewave' cannot evaluate them"),
  (
    ['--algo=qfedavg', '--client_weighting=uniform'],
    "--client_weighting does not apply to algorithm 'qfedavg'",
  ),
  (
    ['--algo=afl', '--client_weighting=examples'],
    "--client_weighting does not apply to algorithm 'afl'",
  ),
  (['--client_learning_rate=inf'], '--client_learning_rate must be a finite number'),
  (['--algo=fedprox', '--mu=nan'], '--mu must be a finite number'),
  (['--regularizer_strength=-inf'], '--regularizer_strength must be a finite number'),
  (['--rounds=ten'], 'flag --rounds=ten'),
  (['--no_such_flag=1'], 'no_such_flag'),
  (['--flagfile=/nonexistent/x.flags'], '/nonexistent/x.flags'),
  (['--flagfile={binary}'], 'flagfile'),
  (['--output_dir={file}'], 'is a file, not a directory'),
  (['--output_dir={file}/run'], 'which is a file'),
  (['--output_dir=' + 'n' * 300], 'n... has 300 bytes; a name here holds at most 255'),
  (['--output_dir=' + '/'.join(['d' * 200] * 20)], "bytes; with the run's files under it"),
  (
    ['--output_dir={run}'],
    'holds another run (metrics.csv); choose another'
    ' directory, pass --resume to continue it or --overwrite',
  ),
  (['--algo=nope'], 'Known algorithms: afl, comfedl, ditto, fedavg, fedavg_subgrad,'),
  # A run's directory whose tensorboard/ is a file (FileExistsError in outputs.py).
  (['--resume', '--output_dir={tb_file}'], 'tensorboard is a file where the run keeps a directory'),
  (  # a run of a plugin's algorithm no longer installed
    ['--algo=fedavg', '--resume', '--output_dir={gone}'],
    "configured differently (algorithm: recorded 'gone_plugin', now 'fedavg'",
  ),
  # A model TensorFlow cannot allocate (a 49-line out-of-memory traceback).
  (
    [
      '--task=stackoverflow_tag',
      '--stackoverflow_tag_source=synthetic',
      '--stackoverflow_tag_vocab_size=2147483647',
    ],
    'vocab_size=2147483647, tag_vocab_size=500 make a model of 1,073,741,824,000 weights',
  ),
  (
    ['--algo=fedavg', '--client_learning_rate=1e6', '--rounds=5', '--output_dir={diverged}'],
    'training diverged at round',
  ),
]


def _make_run_args() -> list[str]:
  """run.py's arguments in the Makefile's `run` recipe (make run's job)."""
  makefile = (pathlib.Path(__file__).resolve().parent.parent / 'Makefile').read_text()
  recipe = makefile[makefile.index('\nrun: ') :].splitlines()[2]
  return recipe.split('binaries/run.py', 1)[1].split()


# make run's job, two rounds of it, twice: the second reports the finished run.
MAKE_RUN = [*_make_run_args(), '--rounds=2', '--output_dir={make_run}']
# Runs that succeed, in this order, in the same interpreter as BAD_INPUT.
GOOD_INPUT = [
  MAKE_RUN,
  MAKE_RUN,
  ['--flagfile={flagfile}'],
  ['--algo=per_fedavg', '--rounds=1', '--output_dir={per_fedavg}'],
  ['--algo=fedavg', '--task=quadratic', '--rounds=2', '--output_dir={rerun}'],
  [
    '--algo=fedavg',
    '--task=quadratic',
    '--rounds=2',
    '--output_dir={rerun}',
    '--overwrite',
    '--seed=3',
    '--data_seed=5',
  ],
  [
    '--algo=fedavg',
    '--task=quadratic',
    '--rounds=2',
    '--eval_period=2',
    '--aggregator=dp',
    '--clip_norm=1.0',
    '--noise_multiplier=1.0',
    '--client_weighting=uniform',
    '--device_model=lognormal',
    '--round_deadline=1.0',
    '--output_dir={private}',
  ],
]


@pytest.fixture(scope='module')
def cli_runs(repo_root, tmp_path_factory):
  """(results, paths): every BAD_INPUT and GOOD_INPUT command line through run.py's
  parser and main, in one interpreter (tests/cli_driver.py; a fresh interpreter
  per case would import TensorFlow each time); test_exit_status_2_from_a_fresh_process
  checks the process-level exit status."""
  root = tmp_path_factory.mktemp('cli')
  paths = {
    name: root / name
    for name in (
      'binary',
      'file',
      'run',
      'diverged',
      'flagfile',
      'rerun',
      'flagfile_out',
      'per_fedavg',
      'tb_file',
      'private',
      'make_run',
      'gone',
    )
  }
  paths['binary'].write_bytes(bytes(range(256)))
  paths['file'].write_text('x')
  paths['run'].mkdir()
  (paths['run'] / 'metrics.csv').write_text('round\n0\n')
  paths['gone'].mkdir()
  (paths['gone'] / 'config.json').write_text('{"algorithm": "gone_plugin"}')
  paths['tb_file'].mkdir()
  (paths['tb_file'] / 'metrics.csv').write_text('round\n0\n')
  (paths['tb_file'] / 'tensorboard').write_text('x')
  paths['flagfile'].write_text(
    '--algo=fedprox\n--mu=0.1\n--task=lasso\n--lasso_dataset=III\n--rounds=2\n'
    f'--clients_per_round=3\n--output_dir={paths["flagfile_out"]}\n'
  )
  cases = []
  for args in [a for a, _ in BAD_INPUT] + GOOD_INPUT:
    argv = [a.format(**paths) for a in args]
    if not any(
      a.startswith(('--output_dir', '--flagfile=' + str(paths['flagfile']))) for a in argv
    ):
      argv.append(f'--output_dir={root / "never-written"}')
    cases.append(argv)
  results = cli_driver.run_all(cases, cwd=repo_root, env=ENV)
  for run in ('run', 'tb_file'):  # left alone
    assert (paths[run] / 'metrics.csv').read_text() == 'round\n0\n'
  assert (paths['tb_file'] / 'tensorboard').read_text() == 'x'
  assert not (root / 'never-written').exists()
  keys = [' '.join(a) for a, _ in BAD_INPUT] + [' '.join(a) for a in GOOD_INPUT]
  return dict(zip(keys, results)), paths


def test_exit_status_2_from_a_fresh_process(repo_root):
  for args, message in ((['--rounds=ten'], 'flag --rounds=ten'),):
    out = _run(repo_root, *args, '--output_dir=/nonexistent/never-written')
    assert out.returncode == 2 and out.stderr.count('\n') == 1, out.stderr
    assert message in out.stderr and 'Traceback' not in out.stderr


@pytest.mark.parametrize('args,message', BAD_INPUT, ids=[' '.join(a) for a, _ in BAD_INPUT])
def test_bad_input_is_one_line_and_exit_2(cli_runs, args, message):
  returncode, stdout, stderr = cli_runs[0][' '.join(args)]
  assert returncode == 2, (stdout, stderr)
  lines = stderr.strip().splitlines()
  assert len(lines) == 1, stderr
  assert message in lines[0]
  assert 'Traceback' not in stderr


def test_divergence_keeps_the_initial_metrics(cli_runs):
  rows = (cli_runs[1]['diverged'] / 'metrics.csv').read_text().splitlines()
  assert rows[1].startswith('0,')  # the initial evaluation is kept


def test_make_run_again_reports_the_finished_run(cli_runs):
  """A second `make run` (its recipe resumes) says the run is done and shows its final
  evaluation, exit 0, its rows written once (it stopped at 'holds another run')."""
  results, paths = cli_runs
  returncode, stdout, stderr = results[' '.join(MAKE_RUN)]
  assert returncode == 0, stderr
  assert 'resuming from round 2: the run had reached its 2 rounds' in stdout, stdout
  assert 'final evaluation:' in stdout
  with (paths['make_run'] / 'metrics.csv').open() as f:
    assert [row['round'] for row in csv.DictReader(f)] == ['0', '1', '2']


def test_flagfile_and_algorithm_and_task_flags(cli_runs):
  returncode, _, stderr = cli_runs[0][' '.join(GOOD_INPUT[2])]
  assert returncode == 0, stderr
  config = json.loads((cli_runs[1]['flagfile_out'] / 'config.json').read_text())
  assert config['algorithm_options'] == {'mu': 0.1}
  assert config['task_options'] == {'dataset': 'III'}


def test_header_says_what_runs_and_rounds_log_what_defines_the_method(cli_runs):
  results, paths = cli_runs
  returncode, stdout, stderr = results[' '.join(GOOD_INPUT[3])]
  assert returncode == 0, stderr
  assert 'per_fedavg on sinewave:' in stdout and ', 10 local steps,' in stdout
  # FedAvg's local_steps of 0 means epochs (the header said '0 local steps').
  header = results[' '.join(GOOD_INPUT[4])][1].splitlines()[0]
  assert ', 1 epoch(s),' in header and 'local steps' not in header, header
  # Its choices among variants, which metrics.csv's hparams do not log.
  assert ', variant fo, client weighting uniform,' in stdout
  assert re.search(r'\d+ clients/round \(uniform\)', stdout) and 'None (None)' not in stdout
  # The final evaluation and the centralized reference line up (the labels were cut to
  # 12 columns): every value starts in one column.
  _, lasso_out, _ = results[' '.join(GOOD_INPUT[2])]
  table = lasso_out[lasso_out.index('final evaluation:') :].splitlines()
  rows = [line for line in table if line.startswith('  ')]
  assert 'centralized reference:' in table and len(rows) > 4
  assert len({len(line.split()[0]) + len(line) - len(line.lstrip()) for line in rows}) == 1
  header = (paths['per_fedavg'] / 'metrics.csv').read_text().splitlines()[0].split(',')
  assert {
    'hparams/client_work/learning_rate',
    'hparams/client_work/alpha',
    'hparams/finalizer/learning_rate',
    'seconds_per_round',
  } <= set(header)


def test_overwrite_replaces_a_run_and_seeds_are_separate(cli_runs):
  results, paths = cli_runs
  assert [results[' '.join(a)][0] for a in GOOD_INPUT[4:6]] == [0, 0]
  # The header says when the task's batch size replaces the builder's.
  assert "batch 1 (task quadratic's; fedavg alone uses 10)" in results[' '.join(GOOD_INPUT[4])][1]
  assert len(list((paths['rerun'] / 'tensorboard').glob('events.*'))) == 1
  config = json.loads((paths['rerun'] / 'config.json').read_text())
  assert (config['seed'], config['data_seed']) == (3, 5)


def test_the_console_shows_the_clock_late_clients_and_the_privacy_spent(cli_runs):
  """A run with devices or DP showed neither its simulated time, nor its late clients,
  nor, at the end, the epsilon it spent."""
  results, paths = cli_runs
  returncode, stdout, stderr = results[' '.join(GOOD_INPUT[6])]
  assert returncode == 0, stderr
  with open(paths['private'] / 'metrics.csv', newline='') as f:
    last = list(csv.DictReader(f))[-1]
  line = next(line for line in stderr.splitlines() if line.startswith('round 2/2'))
  for column in ('time/simulated_seconds', 'participation/late', 'privacy/epsilon'):
    assert f'{column}={float(last[column]):.4g}' in line, line
  spent = stdout[stdout.index('privacy spent:') :].splitlines()[1].split()
  assert spent[0] == 'epsilon' and float(spent[1]) == pytest.approx(
    float(last['privacy/epsilon']), rel=1e-5
  )


def test_sigterm_during_training_leaves_no_worker(repo_root, tmp_path):
  proc = subprocess.Popen(
    [
      sys.executable,
      str(repo_root / 'binaries' / 'run.py'),
      '--rounds=100000',
      '--runtime=tff',
      f'--output_dir={tmp_path}',
    ],
    stdout=subprocess.DEVNULL,
    stderr=subprocess.DEVNULL,
    env=ENV,
    cwd=repo_root,
  )
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
  others = set(workers.worker_pids()) - set(started)  # other test processes' workers
  assert not set(started) & set(workers.wait_for_exit(exclude=others))


def test_custom_aggregation_falls_back_to_tff_saying_why():
  """A process the in-process runtime cannot run goes to TFF's, with the reason."""
  import numpy as np
  import tensorflow as tf
  import tensorflow_federated as tff

  from tff_comp import experiment, models, registry
  import tff_comp.algorithms  # noqa: F401  (registers the algorithms)
  from tff_comp.runtime import choice
  from tff_comp.tasks import array_data

  data = array_data.cached_client_data(
    'fallback',
    ['a', 'b'],
    (2,),
    tf.float32,
    lambda i: (np.ones((3, 2), np.float32) * i, np.ones(3, np.float32)),
  )
  process = registry.get_algorithm('fedavg').build(
    models.linear_regression((2,)),
    client_learning_rate=0.1,
    model_aggregator=tff.learning.robust_aggregator(zeroing=False),
  )
  _, chosen = choice.runner_for(process, data, 'auto')
  assert chosen.startswith('tff (not in-process: its model_aggregator is a TFF factory')
  with pytest.raises(
    experiment.ConfigError, match='--runtime=inprocess: its model_aggregator is a TFF factory'
  ):
    choice.runner_for(process, data, 'inprocess')


def test_ctrl_c_is_one_line_and_keeps_the_metrics(repo_root, tmp_path):
  proc = _start(
    repo_root,
    '--algo=fedavg',
    '--rounds=100000',
    '--eval_period=100000',
    f'--output_dir={tmp_path}',
    stdout=subprocess.DEVNULL,
    stderr=subprocess.PIPE,
  )
  try:
    deadline = time.monotonic() + 120
    csv = tmp_path / 'metrics.csv'
    while time.monotonic() < deadline and (
      not csv.exists() or len(csv.read_text().splitlines()) < 3  # header, rounds 0 and 1
    ):
      time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
  finally:
    proc.kill()
  assert proc.returncode == 130
  lines = stderr.strip().splitlines()
  assert len(lines) == 1 and re.fullmatch(
    r'run.py: interrupted; saved the state of round \d+, --resume continues from it;'
    rf' the metrics written so far are in {re.escape(str(tmp_path))}',
    lines[0],
  ), lines
  rows = csv.read_text().splitlines()
  assert len(rows) >= 3 and rows[-1].split(',')[0] == str(len(rows) - 2)  # whole rows


@pytest.mark.parametrize('presses', [1, 2])
def test_ctrl_c_during_startup_is_one_line_never_a_traceback(repo_root, tmp_path, presses):
  """Ctrl-C while the run starts (TensorFlow loading, the task being built): once, the
  run stops before anything is built or written (it waited for the build and a first
  round, minutes under load); twice, it stops at once. Either way one line, exit 130
  (it printed a traceback, or was swallowed and trained on)."""
  proc = _start(
    repo_root,
    '--algo=fedavg',
    '--rounds=100000',
    f'--output_dir={tmp_path}',
    stdout=subprocess.DEVNULL,
    stderr=subprocess.PIPE,
  )
  try:
    time.sleep(1.0)
    for _ in range(presses):
      proc.send_signal(signal.SIGINT)
      time.sleep(0.2)
    _, stderr = proc.communicate(timeout=120)
  finally:
    proc.kill()
  assert proc.returncode == 130, stderr
  assert 'Traceback' not in stderr and 'Exception ignored' not in stderr, stderr
  assert stderr.strip().splitlines() == ['run.py: interrupted before training; nothing was saved.']
  assert not tmp_path.exists() or not any(tmp_path.iterdir())


@pytest.mark.slow
def test_a_closed_stdout_is_not_an_error(repo_root, tmp_path):
  """`run.py ... | head -1`: the reader leaves after the header; training completes."""
  proc = _start(
    repo_root,
    '--algo=fedavg',
    '--rounds=3',
    f'--output_dir={tmp_path}',
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
  )
  try:
    assert proc.stdout.readline().startswith('fedavg on lasso')
    proc.stdout.close()
    stderr = proc.stderr.read()
    proc.wait(timeout=120)
  finally:
    proc.kill()
  assert proc.returncode == 0, stderr
  assert 'Traceback' not in stderr and 'Error' not in stderr
  assert len((tmp_path / 'metrics.csv').read_text().splitlines()) == 5


@pytest.fixture(scope='module')
def flags_recorded(repo_root, tmp_path_factory):
  """A cache directory where run.py recorded its flags (a first start, with a bad
  flag reported the slow way)."""
  cache = tmp_path_factory.mktemp('flag_cache')
  first = subprocess.run(
    [sys.executable, 'binaries/run.py', '--rounds=ten'],
    capture_output=True,
    text=True,
    timeout=300,
    cwd=repo_root,
    env=dict(ENV, TFF_COMP_DATA_DIR=str(cache)),
  )
  assert first.returncode == 2 and '--rounds=ten' in first.stderr, first.stderr
  return cache


def _run_without_tensorflow(repo_root, tmp_path, cache, *args):
  """run.py `args` with the flags `cache` recorded and a `tensorflow` that fails to
  import (what it says came before TensorFlow would load)."""
  blocked = tmp_path / 'no_tf'
  (blocked / 'tensorflow').mkdir(parents=True)
  (blocked / 'tensorflow' / '__init__.py').write_text('raise ImportError("TF imported")\n')
  env = dict(
    ENV,
    TFF_COMP_DATA_DIR=str(cache),
    PYTHONPATH=os.pathsep.join([str(blocked), ENV.get('PYTHONPATH', '')]),
  )
  return subprocess.run(
    [sys.executable, 'binaries/run.py', *args],
    capture_output=True,
    text=True,
    timeout=60,
    cwd=repo_root,
    env=env,
  )


@pytest.mark.parametrize(
  'bad,says',
  [
    ('--rounds=ten', 'flag --rounds=ten: invalid literal for int()'),
    ('--no_such_flag=1', "Unknown command line flag 'no_such_flag'"),
    ('--sampling=stratified', 'flag --sampling=stratified: value should be one of'),
    ('--flagfile=FILE', 'flag --client_learning_rate=fast: could not convert'),
    ('--batch_size=99999999999', 'flag --batch_size=99999999999: '),
    ('--local_epochs=20000', 'flag --local_epochs=20000: '),
    ('--seed=-1', 'flag --seed=-1: '),
    ('--server_optimizer=adamw', 'flag --server_optimizer=adamw: value should be one of'),
    ('--round_deadline=-1', '--round_deadline must be > 0.0, got -1.0.'),
    ('--dropout_rate=-0.5', '--dropout_rate must be >= 0.0, got -0.5.'),
  ],
)
def test_a_bad_flag_is_one_line_before_tensorflow_loads(
  repo_root, tmp_path, flags_recorded, bad, says
):
  """After a start recorded the flags, a bad flag, value or flagfile is reported
  without importing TensorFlow (a `tensorflow` that fails to import proves it)."""
  flagfile = tmp_path / 'bad.flags'
  flagfile.write_text('--algo=fedavg\n--client_learning_rate=fast\n')
  out = _run_without_tensorflow(
    repo_root, tmp_path, flags_recorded, bad.replace('FILE', str(flagfile))
  )
  lines = out.stderr.strip().splitlines()
  assert out.returncode == 2 and len(lines) == 1, out.stderr
  assert lines[0].startswith('run.py: error: ') and says in lines[0], lines


def test_help_is_printed_without_loading_tensorflow(repo_root, tmp_path, flags_recorded):
  """`--helpfull` imported TensorFlow (9-12 s) for a page of text the first start
  recorded."""
  out = _run_without_tensorflow(repo_root, tmp_path, flags_recorded, '--helpfull')
  assert out.returncode == 0, out.stderr
  assert out.stdout.startswith('Runs one registered algorithm on one registered task.')
  for flag in ('--algo', '--task', '--client_learning_rate', '--emnist_model'):
    assert f'  {flag}:' in out.stdout, flag


# Two run.py processes; the lock under the running pid is test_resume.py's signal test's.
@pytest.mark.slow
def test_a_second_run_into_a_running_runs_directory_is_refused(repo_root, tmp_path):
  proc = _start(
    repo_root,
    '--algo=fedavg',
    '--task=quadratic',
    '--rounds=100000',
    '--eval_period=100000',
    f'--output_dir={tmp_path}',
    stdout=subprocess.DEVNULL,
    stderr=subprocess.DEVNULL,
  )
  try:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (tmp_path / 'metrics.csv').exists():
      time.sleep(0.1)
    second = _run(
      repo_root,
      '--algo=fedavg',
      '--task=quadratic',
      '--rounds=5',
      '--overwrite',
      f'--output_dir={tmp_path}',
    )
  finally:
    proc.kill()
    proc.wait()
  lines = second.stderr.strip().splitlines()
  assert second.returncode == 2 and len(lines) == 1, second.stderr
  assert f'is in use by another run (pid {proc.pid})' in lines[0], lines


@pytest.mark.slow  # a subprocess of its own; resume after damage: test_resume
def test_a_full_disk_is_one_line_and_the_run_resumes(repo_root, tmp_path):
  """A write that finds no room (here a file-size limit, as `ulimit -f`: the same
  errors as a full disk) stops the run with one line naming the directory; what was
  written stays, and --resume finishes the run."""
  import resource

  def limit():
    resource.setrlimit(resource.RLIMIT_FSIZE, (48 * 1024, 48 * 1024))

  args = [
    '--algo=fedavg',
    '--task=quadratic',
    '--rounds=3000',
    '--eval_period=1',
    f'--output_dir={tmp_path / "run"}',
  ]
  _run(
    repo_root,
    '--algo=fedavg',
    '--task=quadratic',
    '--rounds=1',
    f'--output_dir={tmp_path / "warm"}',
  )  # the task's data cached before the limit
  cut = subprocess.run(
    [sys.executable, str(repo_root / 'binaries' / 'run.py'), *args],
    capture_output=True,
    text=True,
    timeout=300,
    env=ENV,
    cwd=repo_root,
    stdin=subprocess.DEVNULL,
    preexec_fn=limit,
  )
  assert cut.returncode == 1, cut.stderr[-2000:]
  assert 'Traceback' not in cut.stderr
  last = cut.stderr.strip().splitlines()[-1]
  assert last.startswith(f'run.py: cannot write to {tmp_path / "run"} (') and (
    'continue with --resume' in last
  )
  written = len((tmp_path / 'run' / 'metrics.csv').read_text().splitlines())
  assert 10 < written < 150, written  # stopped early, its rows kept
  resumed = _run(repo_root, *args[:2], '--rounds=200', *args[3:], '--resume')
  assert resumed.returncode == 0, resumed.stderr[-2000:]
  rows = (tmp_path / 'run' / 'metrics.csv').read_text().splitlines()
  assert len(rows) == 1 + 201 and rows[-1].startswith('200,')


def test_a_second_signal_at_startup_in_a_gc_callback_still_exits(repo_root):
  """The race behind a flaky Ctrl-C test: the second press landing in a garbage-collection
  callback (JAX registers one while TFF loads), where Python ignores a SystemExit with a
  traceback and the program went on. Now it exits there, with the one line."""
  code = (
    'import gc, signal\nfrom tff_comp import signals\nsignals.install("run.py")\n'
    'signals._request(signal.SIGINT, None)\n'
    'gc.callbacks.append(lambda *_: signals._request(signal.SIGINT, None))\n'
    'gc.collect()\nprint("went on")\n'
  )
  out = subprocess.run(
    [sys.executable, '-c', code], capture_output=True, text=True, timeout=60, cwd=repo_root, env=ENV
  )
  assert out.returncode == 130 and 'went on' not in out.stdout, out
  assert out.stderr.strip() == 'run.py: interrupted before training; nothing was saved.'
