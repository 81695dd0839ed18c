"""compare.py: its table against the runs' metrics.csv, its figures in three formats,
and its bad input as one line."""

import csv
import os
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
  assert (tmp_path / 'compare.png').exists()


@pytest.mark.parametrize(
  'args, says',
  [
    ((), 'give the run directories'),
    (('{runs}/nowhere',), 'holds no metrics.csv'),
    (('{runs}/fedavg', '--metrics=accuracy'), 'has no column eval/accuracy (its evaluation'),
    (('{runs}/fedavg', '--labels=a,b'), '--labels names 2 runs; 1 are given'),
    (('{runs}/fedavg', '--at=late'), '--at takes numbers'),
    (('{runs}/fedavg', '--no_such_flag'), 'no_such_flag'),
  ],
)
def test_bad_input_is_one_line_and_exit_2(repo_root, runs, tmp_path, args, says):
  out = _compare(repo_root, *(a.format(runs=runs) for a in args), cwd=tmp_path)
  lines = out.stderr.strip().splitlines()
  assert out.returncode == 2 and len(lines) == 1, out.stderr
  assert says in lines[0] and lines[0].startswith('compare.py: error: ')
