"""compare.py: its table against the runs' metrics.csv, its figures in three formats,
and its bad input as one line."""

import csv
import json
import os
import shlex
import subprocess
import sys

import pytest

from tff_comp import experiment


@pytest.fixture(scope='module')
def runs(tmp_path_factory):
  root = tmp_path_factory.mktemp('runs')
  for algorithm in ('fedavg', 'fedprox'):
    experiment.train(
      algorithm,
      'quadratic',
      rounds=5,
      eval_period=2,
      output_dir=str(root / algorithm),
      show_progress=False,
    )
  return root


def _compare(repo_root, *args, cwd):
  return subprocess.run(
    [sys.executable, str(repo_root / 'binaries' / 'compare.py'), *map(str, args)],
    capture_output=True,
    text=True,
    timeout=120,
    cwd=cwd,
    stdin=subprocess.DEVNULL,
    env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3'),
  )


def _copy_run(source, target, keep=lambda row: True, edit=lambda row: row):
  """A run directory of `source`'s metrics.csv rows that `keep` keeps, `edit`ed."""
  target.mkdir(parents=True)
  with open(source / 'metrics.csv', newline='') as f:
    rows = list(csv.DictReader(f))
  with open(target / 'metrics.csv', 'w', newline='') as f:
    writer = csv.DictWriter(f, list(rows[0]))
    writer.writeheader()
    writer.writerows(edit(dict(r)) for r in rows if keep(r))
  return target


def _column(run, column):
  with open(run / 'metrics.csv', newline='') as f:
    return {int(r['round']): float(r[column]) for r in csv.DictReader(f) if r[column]}


def test_the_table_reads_each_runs_metrics_and_the_figures_come_in_three_formats(
  repo_root, runs, tmp_path
):
  out = _compare(
    repo_root,
    runs / 'fedavg',
    runs / 'fedprox',
    '--metrics=objective,train/client_work/train_loss',
    '--at=3,4',
    '--labels=FedAvg,FedProx',
    f'--output={tmp_path / "fig" / "quad"}',
    cwd=tmp_path,
  )
  assert out.returncode == 0, out.stderr
  table = (tmp_path / 'fig' / 'quad.md').read_text()
  assert table in out.stdout
  rows = {line.split(' | ')[0].strip('| '): line for line in table.splitlines()[2:]}
  for name, run in (('FedAvg', runs / 'fedavg'), ('FedProx', runs / 'fedprox')):
    objective = _column(run, 'eval/objective')  # rounds 0, 2, 4, 5
    loss = _column(run, 'train/client_work/train_loss')
    cells = rows[name].strip('|').split(' | ')[1:]
    assert [c.strip() for c in cells] == [
      f'{objective[2]:.4g} (round 2)',  # no evaluation at round 3: the last before it
      f'{objective[4]:.4g}',
      f'{loss[3]:.4g}',
      f'{loss[4]:.4g}',
    ]
  assert 'Objective @ round 3' in table.splitlines()[0]
  for fmt in ('png', 'pdf', 'svg'):
    assert (tmp_path / 'fig' / f'quad.{fmt}').stat().st_size > 1000


def test_by_default_every_common_evaluation_metric_at_the_last_round(repo_root, runs, tmp_path):
  out = _compare(repo_root, runs / 'fedavg', runs / 'fedprox', cwd=tmp_path)
  assert out.returncode == 0, out.stderr
  header = out.stdout.splitlines()[0]
  assert 'Objective @ round 5' in header and 'Distance to optimum @ round 5' in header
  assert (tmp_path / 'runs' / 'compare.png').exists()


def test_by_default_runs_are_named_by_the_settings_they_differ_in(repo_root, runs, tmp_path):
  """Without --labels the runs are named by what differs in their config.json (folder
  names said nothing of it), the figure titled by their shared task."""
  experiment.train(
    'fedavg',
    'quadratic',
    rounds=5,
    eval_period=2,
    client_learning_rate=0.02,
    output_dir=str(tmp_path / 'faster'),
    show_progress=False,
  )
  out = _compare(repo_root, runs / 'fedavg', runs / 'fedprox', tmp_path / 'faster', cwd=tmp_path)
  assert out.returncode == 0, out.stderr
  names = [line.split(' | ')[0].strip('| ') for line in out.stdout.splitlines()[2:5]]
  # FedProx's own mu is not named: the algorithm says it. The task's default rate is.
  assert names == [
    'fedavg, client_learning_rate=0.01',
    'fedprox, client_learning_rate=0.01',
    'fedavg, client_learning_rate=0.02',
  ]
  assert '<!-- quadratic -->' in (tmp_path / 'runs' / 'compare.svg').read_text()
  two = _compare(repo_root, runs / 'fedavg', runs / 'fedprox', '--title=', cwd=tmp_path)
  assert [line.split(' | ')[0].strip('| ') for line in two.stdout.splitlines()[2:4]] == [
    'fedavg',
    'fedprox',
  ]
  assert '<!-- quadratic -->' not in (tmp_path / 'runs' / 'compare.svg').read_text()


@pytest.mark.parametrize('flag', ['--help', '--helpfull'])
def test_help_is_the_usage_and_exit_status_0(repo_root, tmp_path, flag):
  """As run.py's (absl's help flags exit 1): its docstring and flags, the libraries'
  with --helpfull."""
  out = _compare(repo_root, flag, cwd=tmp_path)
  assert out.returncode == 0 and not out.stderr, out.stderr
  assert out.stdout.startswith('Compares runs') and '--labels' in out.stdout
  assert ('absl.logging' in out.stdout) == (flag == '--helpfull')


def test_a_reader_leaving_early_is_not_an_error(repo_root, runs, tmp_path):
  """`compare.py ... | head -1`: no BrokenPipeError traceback; the figures are written."""
  proc = subprocess.Popen(
    [sys.executable, str(repo_root / 'binaries' / 'compare.py'), runs / 'fedavg', runs / 'fedprox'],
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    stdin=subprocess.DEVNULL,
    text=True,
    cwd=tmp_path,
  )
  try:
    proc.stdout.close()  # before compare.py prints: its imports take a second
    stderr = proc.stderr.read()
    proc.wait(timeout=120)
  finally:
    proc.kill()
  assert proc.returncode == 0 and not stderr, stderr
  assert (tmp_path / 'runs' / 'compare.png').exists()


def _with_settings(source, target, **settings):
  """A copy of the run `source` whose config.json (and its resolved record) says
  `settings`."""
  _copy_run(source, target)
  config = json.loads((source / 'config.json').read_text())
  config.update(settings)
  config['resolved'].update(settings)
  (target / 'config.json').write_text(json.dumps(config))
  return target


def test_a_setting_a_run_does_not_have_is_left_out_of_its_name(repo_root, runs, tmp_path):
  """A null setting (FedAvg's regularizer beside FedDualAvg's l1) is not named
  ("regularizer=null" in a legend says nothing), unless nothing else would name the run."""
  l1 = dict(regularizer='l1', regularizer_strength=0.3)
  plain = _with_settings(runs / 'fedavg', tmp_path / 'plain')
  prox = _with_settings(runs / 'fedprox', tmp_path / 'prox', **l1)
  sparse = _with_settings(runs / 'fedavg', tmp_path / 'sparse', **l1)

  def names(*compared):
    out = _compare(repo_root, *compared, '--metrics=objective', cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    rows = out.stdout.splitlines()[2 : 2 + len(compared)]
    return [line.split(' | ')[0].strip('| ') for line in rows]

  assert names(plain, prox, sparse) == [
    'fedavg',
    'fedprox, regularizer=l1, regularizer_strength=0.3',
    'fedavg, regularizer=l1, regularizer_strength=0.3',
  ]
  assert names(plain, sparse) == [
    'regularizer=none, regularizer_strength=none',
    'regularizer=l1, regularizer_strength=0.3',
  ]


def test_the_default_at_is_the_last_round_every_run_reached(repo_root, runs, tmp_path):
  short = _copy_run(runs / 'fedprox', tmp_path / 'short', keep=lambda r: int(r['round']) <= 3)
  out = _compare(repo_root, runs / 'fedavg', short, '--metrics=objective', cwd=tmp_path)
  assert out.returncode == 0, out.stderr
  header, _, *rows = out.stdout.splitlines()
  assert 'Objective @ round 3' in header
  objective = _column(runs / 'fedavg', 'eval/objective')
  assert f'{objective[2]:.4g} (round 2)' in rows[0]


def test_on_a_time_axis_round_zero_is_at_time_zero(repo_root, runs, tmp_path):
  """Round 0's evaluation has no wall-clock row of its own: it sits at 0 s."""
  out = _compare(
    repo_root, runs / 'fedavg', '--metrics=objective', '--x=seconds', '--at=0', cwd=tmp_path
  )
  assert out.returncode == 0, out.stderr
  objective = _column(runs / 'fedavg', 'eval/objective')
  assert out.stdout.splitlines()[2].split(' | ')[1].strip(' |') == f'{objective[0]:.4g}'


def _damaged(runs, tmp_path, damage):
  if damage == 'header only':
    return _copy_run(runs / 'fedavg', tmp_path / 'damaged', keep=lambda r: False)
  if damage == 'binary':
    (tmp_path / 'damaged').mkdir()
    (tmp_path / 'damaged' / 'metrics.csv').write_bytes(bytes(range(256)) * 4)
    return tmp_path / 'damaged'
  field = 'round' if damage == 'bad round' else 'eval/objective'
  return _copy_run(runs / 'fedavg', tmp_path / 'damaged', edit=lambda r: {**r, field: 'n/a'})


@pytest.mark.parametrize(
  'damage, args, says',
  [
    ('header only', (), 'metrics.csv has no rows yet'),
    ('binary', (), 'metrics.csv cannot be read as a CSV file'),
    ('bad round', (), 'holds a value that is no number'),
    ('bad value', ('--metrics=objective',), 'holds a value that is no number'),
    ('none', ('--x=bogus',), '--x=bogus is no column of'),
    ('none', ('--at=nan',), '--at takes finite numbers'),
    ('none', ('--output={file}/compare',), 'its folder cannot be made'),
  ],
)
def test_damaged_files_and_bad_values_are_one_line_with_nothing_written(
  repo_root, runs, tmp_path, damage, args, says
):
  run = runs / 'fedavg' if damage == 'none' else _damaged(runs, tmp_path, damage)
  (tmp_path / 'file').write_text('a regular file')
  work = tmp_path / 'work'
  work.mkdir()
  out = _compare(repo_root, run, *(a.format(file=tmp_path / 'file') for a in args), cwd=work)
  lines = out.stderr.strip().splitlines()
  assert out.returncode == 2 and len(lines) == 1, out.stderr
  assert says in lines[0] and lines[0].startswith('compare.py: error: ')
  assert not list(work.iterdir())


@pytest.mark.parametrize(
  'args, says',
  [
    ((), 'give the run directories'),
    (('{runs}/nowhere',), 'holds no metrics.csv'),
    (('{runs}/fedavg', '--metrics=accuracy'), 'has no column eval/accuracy (its evaluation'),
    (('{runs}/fedavg', '--labels=a,b'), '--labels names 2 runs; 1 are given'),
    (('{runs}/fedavg', '--at=late'), '--at takes finite numbers'),
    (('{runs}/fedavg', '--no_such_flag'), 'no_such_flag'),
  ],
)
def test_bad_input_is_one_line_and_exit_2(repo_root, runs, tmp_path, args, says):
  out = _compare(repo_root, *(a.format(runs=runs) for a in args), cwd=tmp_path)
  lines = out.stderr.strip().splitlines()
  assert out.returncode == 2 and len(lines) == 1, out.stderr
  assert says in lines[0] and lines[0].startswith('compare.py: error: ')


def test_the_readme_compares_runs_its_own_commands_make(repo_root):
  """The README's command-line examples, run in order after `make run`, make every run
  directory its compare.py line reads, and none writes where an earlier one wrote (it
  would stop at "holds another run"). Read, not run: the runs themselves are other
  tests'."""
  readme = (repo_root / 'README.md').read_text()
  block = readme.split('## From the command line', 1)[1].split('```sh\n', 1)[1]
  block = block.split('```', 1)[0].replace('\\\n', ' ')
  made = ['runs/feddualavg-lasso']  # make run's
  compared = []
  for line in block.splitlines():
    words = shlex.split(line, comments=True)
    flags = dict(
      w.removeprefix('--').split('=', 1) for w in words if w.startswith('--') and '=' in w
    )
    if words[1:2] == ['binaries/run.py'] and 'algo' in flags:
      made.append(flags.get('output_dir', f'runs/{flags["algo"]}-{flags["task"]}'))
    elif words[1:2] == ['binaries/compare.py']:
      compared = [w for w in words[2:] if not w.startswith('--')]
  assert len(made) == len(set(made)), made
  assert compared and set(compared) <= set(made), (compared, made)
