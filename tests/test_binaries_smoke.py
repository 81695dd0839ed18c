"""Smoke tests of reproduce.py (a tiny grid, in process) and bench.py (a subprocess)."""

import ast
import csv
import dataclasses
import importlib
import inspect
import json
import os
import re
import signal
import subprocess
import sys
import time
from typing import Any

import psutil
import pytest

from tff_comp import experiment as experiment_lib
from tff_comp import registry
from tff_comp.binaries import grid, reproductions, summary


def test_reproduce_writes_table_and_plot(tmp_path, capfd):
  spec = reproductions.Reproduction(
    task='quadratic',
    algorithms=('fedavg', 'fednova'),
    client_learning_rates=(0.01,),
    server_learning_rates=(1.0, 2.0),
    rounds=4,
    checkpoints=(2, 4),
    metric='distance_to_optimum',
    higher_is_better=False,
    eval_period=2,
    plot_metrics=('objective', 'distance_to_optimum'),
  )
  curves = grid.run_grid('tiny', spec, spec.rounds, (0,), tmp_path, parallel=2)
  assert set(curves['fednova']) == {(0.01, 1.0), (0.01, 2.0)}
  # The grid's processes exit quietly: TFF's default context, left in them at exit,
  # printed an "Exception ignored" traceback from each.
  err = capfd.readouterr().err
  assert 'Traceback' not in err and 'Exception ignored' not in err, err
  # The two processes share the cores (kernel threads as TensorFlow's inter-op pool).
  record = json.loads((tmp_path / 'fedavg' / 'lr_0.01_2' / 'config.json').read_text())
  assert record['runtime_record']['kernel_threads'] == max(1, len(os.sched_getaffinity(0)) // 2)
  # Rerun with resume: every configuration is finished, so nothing is trained again.
  metrics = tmp_path / 'fedavg' / 'lr_0.01_2' / 'metrics.csv'
  written = metrics.read_text()
  metrics.touch()
  assert grid.run_grid('tiny', spec, spec.rounds, (0,), tmp_path, resume=True) == curves
  assert metrics.read_text() == written
  table = summary.summarize('tiny', spec, curves, spec.rounds, tmp_path, 'cmd')
  assert '| fednova |' in table and 'distance_to_optimum @ 4' in table
  assert (tmp_path / 'results.md').read_text() == table
  assert (tmp_path / 'tiny.png').stat().st_size > 1000
  assert (tmp_path / 'fedavg' / 'lr_0.01_2' / 'metrics.csv').exists()


def test_a_grid_with_a_configuration_the_settings_refuse_starts_no_unit(tmp_path):
  """Refused before any unit: in processes, the other units ran to their end first."""
  spec = _quadratic(
    algorithms=('fedavg', 'median_of_2'),
    aliases={'median_of_2': 'fedavg'},
    algorithm_settings={'median_of_2': dict(aggregator='median', clients_per_round=2)},
    seeds=(0, 1, 2),
  )
  with pytest.raises(experiment_lib.ConfigError, match='--aggregator=median needs at least 3'):
    grid.run_grid('refused', spec, spec.rounds, spec.seeds, tmp_path, parallel=2)
  assert not list(tmp_path.rglob('metrics.csv'))


def test_every_built_in_comparison_tunes_each_method_alike():
  """Equal budgets: in each built-in experiment every method's grid has the same size,
  3 seeds run, and configurations are chosen on another metric than the one reported
  (validation data, or the objective the optimization papers minimize)."""
  for name in registry.REPRODUCTIONS.names():
    spec = registry.REPRODUCTIONS.get(name).build()
    sizes = {a: len(reproductions.configurations(spec, a)) for a in spec.algorithms}
    assert len(set(sizes.values())) == 1, (name, sizes)
    assert len(spec.seeds) >= 3, name
    assert reproductions.selection(spec)[0] != spec.metric, name


def _grid_check(name: str):
  """`name` as a test parameter; slow where the check calibrates DP noise to a target
  epsilon (accounting over the grid's rounds: seconds to tens of seconds each)."""
  spec = registry.REPRODUCTIONS.get(name).build()
  settings = [spec.settings, *spec.algorithm_settings.values()]
  slow = any('target_epsilon' in s for s in settings)
  return pytest.param(name, marks=pytest.mark.slow) if slow else name


@pytest.mark.parametrize('name', [_grid_check(n) for n in registry.REPRODUCTIONS.names()])
def test_every_built_in_grid_is_a_configuration_the_settings_take(name, tmp_path):
  """Every configuration of every built-in experiment prepares as `reproduce.py` runs it
  (a robust combiner sees the rows its rule needs: Krum after bucketing reads the
  buckets, and a grid with too few went unrefused, clamped)."""
  spec = registry.REPRODUCTIONS.get(name).build()
  grid.check_grid(spec, spec.seeds, spec.rounds, tmp_path, {})


def test_own_axes_are_set_through_hparams_or_as_build_options(tmp_path):
  """q-FedAvg's q is a client hparam (one build); FedProx's mu an option (a build each):
  each run records and uses its configuration's value."""
  spec = _quadratic(
    algorithms=('qfedavg', 'fedprox'),
    eval_period=1,
    tuning=dict(qfedavg=dict(q=(0.5, 2.0)), fedprox=dict(mu=(0.01, 1.0))),
  )
  curves = grid.run_grid('own', spec, 2, (0,), tmp_path)
  assert set(curves['qfedavg']) == {(0.01, 1.0, 0.5), (0.01, 1.0, 2.0)}
  for q in (0.5, 2.0):
    out = tmp_path / 'qfedavg' / f'lr_0.01_1_q_{q:g}'
    rows = list(csv.DictReader(open(out / 'metrics.csv')))
    assert float(rows[-1]['hparams/client_work/q']) == q
    assert json.loads((out / 'config.json').read_text())['resolved']['algorithm_options']['q'] == q
  for mu in (0.01, 1.0):
    out = tmp_path / 'fedprox' / f'lr_0.01_1_mu_{mu:g}'
    rows = list(csv.DictReader(open(out / 'metrics.csv')))
    assert float(rows[-1]['hparams/client_work/proximal_strength']) == pytest.approx(mu)
  # A stronger proximal term keeps the iterate nearer the start: the runs differ.
  assert (
    curves['fedprox'][(0.01, 1.0, 0.01)][0]['distance_to_optimum'][2]
    != curves['fedprox'][(0.01, 1.0, 1.0)][0]['distance_to_optimum'][2]
  )


def test_the_selected_configuration_is_chosen_on_validation_data(tmp_path):
  """Where the reported metric and its validation counterpart disagree, the table
  reports the configuration validation data chose, not the best reported number."""
  spec = reproductions.Reproduction(
    task='quadratic',
    algorithms=('fedavg',),
    client_learning_rates=(0.1, 0.2),
    server_learning_rates=(1.0,),
    rounds=2,
    checkpoints=(2,),
    metric='accuracy',
    select_on='validation_accuracy',
  )
  run = lambda test, val: [{'accuracy': {0: 0.0, 2: test}, 'validation_accuracy': {0: 0.0, 2: val}}]
  curves = {'fedavg': {(0.1, 1.0): run(0.9, 0.5), (0.2, 1.0): run(0.6, 0.7)}}
  table = summary.summarize('select', spec, curves, 2, tmp_path, 'cmd')
  assert '| fedavg | eta_c=0.2, eta_s=1 | 0.6 |' in table, table
  # The selection sits on the grid's edge (the largest eta_c tried): the table says so.
  assert 'edge of its grid (a wider grid might find better): fedavg: eta_c=0.2 (largest' in table


def test_curves_against_simulated_time_and_the_time_to_a_target(tmp_path):
  """With an x-axis column, the table gives the time each algorithm's metric first
  reached the target (mean over seeds, or who never did), and the plot a second row."""
  spec = reproductions.Reproduction(
    task='quadratic',
    algorithms=('slow', 'fast'),
    client_learning_rates=(0.1,),
    server_learning_rates=(1.0,),
    rounds=4,
    checkpoints=(4,),
    metric='accuracy',
    select_on='train_accuracy',
    x_axis='time/simulated_seconds',
    target=0.5,
  )

  def run(accuracies, seconds_per_round):
    rounds = range(0, 5, 2)
    return {
      'accuracy': dict(zip(rounds, accuracies)),
      'train_accuracy': dict(zip(rounds, accuracies)),
      'time/simulated_seconds': {r: r * seconds_per_round for r in range(1, 5)},
    }

  curves = {
    'slow': {(0.1, 1.0): [run((0.0, 0.6, 0.8), 10.0), run((0.0, 0.4, 0.7), 12.0)]},
    'fast': {(0.1, 1.0): [run((0.0, 0.5, 0.9), 3.0), run((0.0, 0.3, 0.4), 3.0)]},
  }
  table = summary.summarize('timed', spec, curves, 4, tmp_path, 'cmd')
  assert 'time/simulated_seconds to accuracy ≥ 0.5 |' in table, table
  # slow: round 2 at 10 s, round 4 at 48 s; fast: one seed at 6 s, the other never.
  assert '| slow | eta_c=0.1, eta_s=1 | 0.75 ± 0.05 | 34 ± 14 |' in table, table
  assert (
    '| fast | eta_c=0.1, eta_s=1 | 0.65 ± 0.25 | not reached by 1 of 2 seeds'
    ' (the others: 6) |' in table
  ), table
  assert (tmp_path / 'timed.png').stat().st_size > 1000


def _quadratic(**fields: Any) -> reproductions.Reproduction:
  """A grid on the quadratic task: FedAvg at one learning rate a side for 2 rounds,
  scored by the distance to the optimum, as `fields` do not say otherwise."""
  return reproductions.Reproduction(
    **{
      'task': 'quadratic',
      'algorithms': ('fedavg',),
      'client_learning_rates': (0.01,),
      'server_learning_rates': (1.0,),
      'rounds': 2,
      'checkpoints': (2,),
      'metric': 'distance_to_optimum',
      'higher_is_better': False,
      **fields,
    }
  )


def _tiny(lr: float, rounds: int = 100) -> reproductions.Reproduction:
  return _quadratic(
    client_learning_rates=(lr,), rounds=rounds, checkpoints=(50, 100), eval_period=1
  )


def test_a_short_run_tables_the_rounds_it_has(tmp_path):
  curves = grid.run_grid('short', _tiny(0.01), 3, (0,), tmp_path)
  table = summary.summarize('short', _tiny(0.01), curves, 3, tmp_path, 'cmd')
  assert 'distance_to_optimum @ 3 |' in table and 'distance_to_optimum @ 50' not in table
  assert 'diverged at' not in table


def test_a_diverged_configuration_says_when(tmp_path, capsys):
  # eta_c = 5 on F = 0.5 ||x - e||^2 multiplies the error by 4 a step: inf in round 1.
  curves = grid.run_grid('diverges', _tiny(5.0), 3, (0, 1), tmp_path)
  assert 'diverged at round 1' in capsys.readouterr().out
  table = summary.summarize('diverges', _tiny(5.0), curves, 3, tmp_path, 'cmd')
  assert '| fedavg | eta_c=5, eta_s=1 | diverged at round 1 |' in table


def test_a_run_diverging_between_evaluations_says_its_round(tmp_path, capsys):
  # eta_c = 2.2 multiplies the error by 1.2 a step: inf in round 7, evaluated every 10.
  spec = dataclasses.replace(_tiny(2.2, rounds=40), checkpoints=(20, 40), eval_period=10)
  curves = grid.run_grid('late', spec, 40, (0,), tmp_path)
  out = capsys.readouterr().out
  assert 'training diverged at round 7' in out and 'seed=0 diverged at round 7' in out, out
  table = summary.summarize('late', spec, curves, 40, tmp_path, 'cmd')
  assert '| fedavg | eta_c=2.2, eta_s=1 | diverged at round 7 |' in table, table


def _reproduce(repo_root, args):
  return subprocess.run(
    [sys.executable, str(repo_root / 'binaries' / 'reproduce.py'), *args],
    capture_output=True,
    text=True,
    timeout=600,
    cwd=repo_root,
    stdin=subprocess.DEVNULL,
    env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3'),
  )


def _start_reproduce(repo_root, args, stdout) -> subprocess.Popen:
  """reproduce.py running with `args`, its stdout `stdout` and its stderr a pipe."""
  return subprocess.Popen(
    [sys.executable, str(repo_root / 'binaries' / 'reproduce.py'), *args],
    stdout=stdout,
    stderr=subprocess.PIPE,
    text=True,
    cwd=repo_root,
    env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3'),
  )


def test_a_grid_already_run_there_is_one_line_before_any_unit_starts(repo_root, tmp_path):
  """reproduce.py run twice into one --output_dir: the second said the first of its runs
  held another run, after its processes had started."""
  spec = registry.REPRODUCTIONS.get('fco_lasso').build()
  held = grid.run_dirs(tmp_path / 'fco_lasso', spec, spec.algorithms[-1], spec.seeds)[-1]
  held.mkdir(parents=True)
  (held / 'metrics.csv').write_text('round\n0\n')
  out = _reproduce(repo_root, ['--experiment=fco_lasso', '--rounds=1', f'--output_dir={tmp_path}'])
  assert out.returncode == 2, out.stderr
  runs = sum(len(reproductions.configurations(spec, a)) for a in spec.algorithms) * len(spec.seeds)
  assert out.stderr.strip() == (
    f'reproduce.py: error: --output_dir={tmp_path} holds 1 of the {runs} runs of fco_lasso'
    f' (the first: {held}); pass --resume to read the'
    ' finished ones back and run the rest, --overwrite to run them anew, or'
    ' --summarize_only to rebuild the table from them.'
  )
  assert out.stdout == '' and [p.name for p in (tmp_path / 'fco_lasso').iterdir()] == [
    spec.algorithms[-1]
  ]


def test_summarizing_a_grid_not_run_there_is_one_line(repo_root, tmp_path):
  """--summarize_only where the grid's runs are not (a wrong --output_dir) says so in one
  line and exit status 2, and leaves no directory behind; it was a traceback."""
  out = _reproduce(
    repo_root,
    ['--experiment=fco_lasso', '--summarize_only', f'--output_dir={tmp_path / "elsewhere"}'],
  )
  assert out.returncode == 2, out.stderr
  lines = out.stderr.strip().splitlines()
  assert len(lines) == 1 and "192 of the grid's runs have no metrics.csv" in lines[0], lines
  assert not (tmp_path / 'elsewhere').exists()


@pytest.mark.parametrize(
  'arg, says',
  [
    ('--rounds=0', 'flag --rounds=0: 0 is not a positive integer'),
    ('--batch_memory_budget=nan', '--batch_memory_budget must be a finite number of MB'),
    ('--parallel=100000', 'flag --parallel=100000: 100000 is not an integer in the range'),
    pytest.param(  # Ray's own unreachable-cluster line: test_ray
      '--ray_address=127.0.0.1:1',
      'the Ray cluster at --ray_address=127.0.0.1:1 cannot be',
      marks=pytest.mark.slow,
    ),
  ],
)
def test_a_bad_grid_flag_is_one_line_before_any_work(repo_root, tmp_path, arg, says):
  """`--rounds=0` ran the whole grid at the experiment's own rounds; NaN passed the
  memory budget's bound and traced back in trials.py; --parallel had no ceiling; a Ray
  cluster not there was found after the grid's directory was made."""
  out = _reproduce(repo_root, ['--experiment=fco_lasso', arg, f'--output_dir={tmp_path / "g"}'])
  assert out.returncode == 2, out.stderr
  lines = out.stderr.strip().splitlines()
  assert len(lines) == 1 and says in lines[0], lines
  assert not (tmp_path / 'g').exists()


# Three reproduce.py processes; test_reproduce_writes_table_and_plot runs by default.
@pytest.mark.slow
def test_reproduce_is_steered_from_the_command_line_and_records_it(repo_root, tmp_path):
  args = [
    '--experiment=fco_lasso',
    '--rounds=2',
    '--algorithms=feddualavg',
    '--client_learning_rates=0.001',
    '--server_learning_rates=10',
    '--eval_period=1',
    f'--output_dir={tmp_path}',
  ]
  out = _reproduce(repo_root, args)
  assert out.returncode == 0, out.stderr
  assert not out.stderr.strip(), out.stderr  # no INFO chatter (checkpoints, TF)
  table = (tmp_path / 'fco_lasso' / 'results.md').read_text()
  assert f'Command: `python binaries/reproduce.py {" ".join(args)}`' in table
  # It ends saying where it wrote (it printed the table alone).
  assert out.stdout.strip().splitlines()[-1] == (
    f'wrote {tmp_path}/fco_lasso/results.md and {tmp_path}/fco_lasso/fco_lasso.png'
    f' (.pdf, .svg); each run is under {tmp_path}/fco_lasso/<algorithm>/'
  )
  # How long it took and on what machine.
  assert re.search(
    r'Took \d+ min \d+ s on \d+ CPUs \(.+\), (no GPU|\d+ GPU\(s\)),'
    r' \d{4}-\d\d-\d\d \(--parallel=1, --batch_trials\)\.',
    table,
  ), table
  assert '| feddualavg | eta_c=0.001, eta_s=10 |' in table and 'f1 @ 2' in table
  runs = list((tmp_path / 'fco_lasso').glob('*/lr_*'))
  assert [r.name for r in runs] == ['lr_0.001_10']
  # Summarizing again keeps the runs' own command and timing, and says what rewrote it.
  took = next(line for line in table.splitlines() if line.startswith('Took '))
  again = [*args, '--summarize_only']
  out = _reproduce(repo_root, again)
  assert out.returncode == 0, out.stderr
  # A second rewrite keeps the timing and names only the latest rewrite.
  assert summary.earlier_record(tmp_path / 'fco_lasso' / 'results.md') == (
    f'python binaries/reproduce.py {" ".join(args)}',
    took,
  )
  rewritten = (tmp_path / 'fco_lasso' / 'results.md').read_text()
  assert f'Command: `python binaries/reproduce.py {" ".join(args)}`' in rewritten
  assert (
    f'{took} Tables and plot rewritten by `python binaries/reproduce.py {" ".join(again)}`.\n'
  ) in rewritten, rewritten
  # Resumed, the grid's time is this run's alone, and the record says so.
  out = _reproduce(repo_root, [*args, '--resume'])
  assert out.returncode == 0, out.stderr
  assert re.search(
    r'Took \d+ min \d+ s .*\(--parallel=1, --batch_trials, --resume: the runs finished'
    r' before were read back, untimed\)\.\n',
    (tmp_path / 'fco_lasso' / 'results.md').read_text(),
  )
  bad = _reproduce(repo_root, ['--client_learning_rates=fast', f'--output_dir={tmp_path}'])
  assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr


def _bench(repo_root, *args):
  return subprocess.run(
    [sys.executable, str(repo_root / 'binaries' / 'bench.py'), '--rounds=1', '--repeats=1', *args],
    capture_output=True,
    text=True,
    timeout=600,
    cwd=repo_root,
    stdin=subprocess.DEVNULL,
    env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3'),
  )


@pytest.mark.slow
def test_a_bad_bench_flag_is_one_line_and_exit_2(repo_root):
  """bench.py's flags are checked as run.py's are: it printed absl's usage text and
  exited 1, took --rounds=0, and met --sweep=abc with a traceback."""
  for bad in ('--sweep=abc', '--rounds=0'):
    out = _bench(repo_root, bad)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1, out.stderr[-2000:]
    assert lines[0].startswith(f'bench.py: error: flag {bad.split("=")[0]}='), lines


@pytest.mark.parametrize(
  'bad, says',
  [
    ('--rounds=100000000000', 'is not an integer in the range [1, 100000000]'),
    # A bench.py process each (TensorFlow loads before its flags parse): make test-slow.
    pytest.param(
      '--workload=grid --grid_experiment=bogus', 'value should be one of <', marks=pytest.mark.slow
    ),
    pytest.param(
      '--fedjax_python=/bin/true', 'is not a Python that imports fedjax', marks=pytest.mark.slow
    ),
    pytest.param(
      '--flower_python=/bin/true', 'is not a Python that imports flwr', marks=pytest.mark.slow
    ),
    pytest.param(
      '--fedjax_python={tmp}/not_python',
      'cannot be run (Exec format error)',
      marks=pytest.mark.slow,
    ),
  ],
)
def test_a_bench_flag_it_cannot_use_is_one_line_before_any_part(repo_root, tmp_path, bad, says):
  """Accepted once: 1e11 rounds (no ceiling); a grid that is not one (exit 0 after
  "failed"); an executable that is not FedJAX's Python (part 1 traced back with
  `Exec format error` after the other parts' minutes)."""
  (tmp_path / 'not_python').write_bytes(b'\x7fELF')
  (tmp_path / 'not_python').chmod(0o755)
  out = _bench(repo_root, *bad.format(tmp=tmp_path).split())
  lines = out.stderr.strip().splitlines()
  assert out.returncode == 2 and len(lines) == 1, out.stderr[-2000:]
  assert says in lines[0], lines


@pytest.mark.parametrize('bad', ['--port=0', 'extra'])
def test_a_bad_worker_flag_is_one_line_and_exit_2(repo_root, bad):
  """worker.py (a host's TFF worker for run.py --workers) fails as run.py does; absl's
  parser printed its usage text and exited 1."""
  out = subprocess.run(
    [sys.executable, str(repo_root / 'binaries' / 'worker.py'), bad],
    capture_output=True,
    text=True,
    timeout=60,
    stdin=subprocess.DEVNULL,
  )
  lines = out.stderr.strip().splitlines()
  assert out.returncode == 2 and len(lines) == 1, out.stderr[-2000:]
  assert lines[0].startswith('worker.py: error: '), lines


def test_the_bench_child_scripts_name_what_the_library_has(repo_root):
  """The Python bench.py runs in fresh processes (string constants, which neither the
  linter nor an import sees) imports modules that exist and uses their names: part 5
  imported `tff_comp.runtime.sampling` long after it moved, failing `make bench` only
  (its run is `make test-slow`'s test_bench_runs)."""
  scripts = 0
  for path in sorted((repo_root / 'binaries').glob('*.py')):
    for node in ast.parse(path.read_text()).body:
      if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)):
        continue
      if not isinstance(node.value.value, str) or 'from tff_comp' not in node.value.value:
        continue
      scripts += 1
      imported = {}
      for statement in ast.parse(node.value.value).body:
        if isinstance(statement, ast.ImportFrom):
          for alias in statement.names:
            module = importlib.import_module(statement.module)
            imported[alias.asname or alias.name] = getattr(module, alias.name, None) or (
              importlib.import_module(f'{statement.module}.{alias.name}')
            )
      for use in ast.walk(ast.parse(node.value.value)):
        if isinstance(use, ast.Attribute) and isinstance(use.value, ast.Name):
          owner = imported.get(use.value.id)
          if inspect.ismodule(owner):
            assert hasattr(owner, use.attr), f'{path.name} {node.targets[0].id}: {ast.unparse(use)}'
  assert scripts >= 2


@pytest.mark.slow
def test_bench_part_1_runs_and_prints_its_ratios(repo_root):
  """Part 1 alone (its TFF paths take most of a minute: `make test-slow`)."""
  out = _bench(repo_root, '--sweep=', '--tff_workers=0', '--nofirst_rounds', '--run_py_rounds=4')
  assert out.returncode == 0, out.stderr
  assert 'a/b =' in out.stdout and 'a/c =' in out.stdout and 'a/d =' in out.stdout
  assert '(e) run.py end to end, 4 rounds' in out.stdout and 'e/a =' in out.stdout
  assert 'Peers: not timed (no --fedjax_python' in out.stdout


@pytest.mark.slow
def test_bench_runs(repo_root):
  out = _bench(
    repo_root,
    '--sweep=10',
    '--sweep_tff_max=10',
    '--population=20',
    '--memory_rounds=2',
    '--run_py_rounds=4',
  )
  assert out.returncode == 0, out.stderr
  assert 'a/b =' in out.stdout and 'a/c =' in out.stdout and 'a/d =' in out.stdout
  assert '(e) run.py end to end, 4 rounds' in out.stdout and 'e/a =' in out.stdout
  assert 'Peers: not timed (no --fedjax_python' in out.stdout
  assert "a/a' =" in out.stdout and '10 clients/round: lanes' in out.stdout
  assert 'mapped' in out.stdout and 'TFF worker' in out.stdout
  assert 'on 2 local TFF workers' in out.stdout and 'speedup' in out.stdout
  assert 'Part 4: host memory over 2 rounds of 20 clients' in out.stdout
  assert 'auto   first' in out.stdout and 'run.py --rounds=ten: error after' in out.stdout
  assert (
    'run.py --task=emnist --emnist_source=synthetic --emnist_model=cnn --rounds=2: ' in out.stdout
  )
  assert 'the lanes kernel compiled 1 time(s), recompiles 0' in out.stdout


@pytest.mark.slow
@pytest.mark.parametrize(
  'workload, says',
  [
    (['--workload=emnist_cnn', '--emnist_clients=2'], 'a/d = '),
    (['--workload=streaming'], 'ratio '),
    (
      ['--workload=grid', '--grid_experiment=fco_lasso', '--grid_rounds=2', '--grid_parallel=1'],
      'tables identical: yes',
    ),
    (['--workload=aggregators'], 'medians of 5 blocks of 1 rounds, alternating with the plain'),
  ],
)
def test_bench_workloads_run(repo_root, workload, says):
  out = _bench(repo_root, *workload)
  assert out.returncode == 0, out.stderr[-3000:]
  assert says in out.stdout, out.stdout


def test_every_binary_takes_a_closed_stdout(repo_root):
  """Every binary's `main` given to absl's `app.run` is wrapped by
  `closed_stdout.closing_stdout_quietly` (`bench.py | head -1` ended in a traceback),
  read from the source; worker.py is exempt: it execs TFF's worker binary."""
  unwrapped = []
  for path in sorted((repo_root / 'binaries').glob('*.py')):
    tree = ast.parse(path.read_text())
    runs = [
      node.args[0].id
      for node in ast.walk(tree)
      if isinstance(node, ast.Call)
      and ast.unparse(node.func) == 'app.run'
      and isinstance(node.args[0], ast.Name)
    ]
    for node in tree.body:
      if isinstance(node, ast.FunctionDef) and node.name in runs:
        wrapped = 'closed_stdout.closing_stdout_quietly' in map(ast.unparse, node.decorator_list)
        if not wrapped and path.name != 'worker.py':
          unwrapped.append(f'{path.name}:{node.name}')
  assert not unwrapped


@pytest.mark.slow
def test_a_reader_leaving_a_grid_early_is_not_an_error(repo_root, tmp_path):
  """`reproduce.py ... | head -1`: the grid's --parallel processes print to the same
  closed pipe; no BrokenPipeError traceback, every unit runs, the table is written."""
  proc = _start_reproduce(
    repo_root,
    [
      '--experiment=fco_lasso',
      '--rounds=2',
      '--seeds=1',
      '--algorithms=feddualavg',
      '--client_learning_rates=0.001',
      '--server_learning_rates=3,10',
      '--parallel=2',
      '--nobatch_trials',
      f'--output_dir={tmp_path}',
    ],
    subprocess.PIPE,
  )
  try:
    proc.stdout.close()  # before anything is printed: reproduce.py imports TensorFlow first
    stderr = proc.stderr.read()
    proc.wait(timeout=300)
  finally:
    proc.kill()
  assert proc.returncode == 0 and 'Error' not in stderr, stderr
  assert '| feddualavg |' in (tmp_path / 'fco_lasso' / 'results.md').read_text()


@pytest.mark.slow
@pytest.mark.parametrize('sig', [signal.SIGTERM, signal.SIGKILL])
def test_a_grids_processes_stop_with_it(repo_root, tmp_path, sig):
  """`kill` (SIGTERM) reaches reproduce.py's parent alone: it forwards the signal to its
  --parallel processes, whose configurations stop at their round's end, and exits 143
  with one line; a parent killed outright (SIGKILL) sends them SIGTERM through the
  kernel, and each exits once its configuration stopped. The grid's processes ran on to
  their last round before, either way; then, orphaned, they waited for more units
  forever, holding the grid's stderr (this test hung in `communicate`)."""
  out_dir = tmp_path / 'g'
  proc = _start_reproduce(
    repo_root,
    [
      '--experiment=fco_lasso',
      '--rounds=100000',
      '--seeds=1',
      '--parallel=2',
      '--nobatch_trials',
      f'--output_dir={out_dir}',
    ],
    subprocess.DEVNULL,
  )
  children = []
  try:
    deadline = time.monotonic() + 400
    while time.monotonic() < deadline:  # both processes in their rounds
      started = [m for m in out_dir.rglob('metrics.csv') if len(m.read_text().splitlines()) > 2]
      if len({m.relative_to(out_dir).parts[1] for m in started}) >= 2:
        break
      time.sleep(1)
    else:
      pytest.fail('the grid did not start')
    children = psutil.Process(proc.pid).children(recursive=True)
    proc.send_signal(sig)
    _, stderr = proc.communicate(timeout=300)
    _, alive = psutil.wait_procs(children, timeout=120)
  finally:
    proc.kill()
    for child in children:
      if child.is_running():
        child.kill()
  assert not alive, alive
  if sig == signal.SIGTERM:
    assert proc.returncode == 143, stderr
    assert 'reproduce.py: terminated (SIGTERM)' in stderr, stderr
