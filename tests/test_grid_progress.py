"""A grid's progress line: each unit's rounds so far, read from its runs' metrics.csv
(`binaries/grid_progress.py`), and said while a grid runs in other processes; the
processes a grid runs in by default."""

import os
import re

import pytest

from tff_comp.binaries import grid, grid_processes, grid_progress, reproductions


def _write_rows(run, rounds: int) -> None:
  run.mkdir(parents=True, exist_ok=True)
  rows = ''.join(f'{r},{0.1 * r:.4f},{1.0 / (r + 1):.6f}\n' for r in range(rounds + 1))
  (run / 'metrics.csv').write_text('round,seconds,train_loss\n' + rows)


def test_the_line_counts_each_units_rounds_from_its_runs_files(tmp_path):
  first = [tmp_path / 'a' / f'run_{k}' for k in range(3)]
  second = [tmp_path / 'b' / 'run_0']
  progress = grid_progress.GridProgress(['a', 'b, seed 1'], [first, second], 10, every=3600)
  assert progress.line().endswith(': a waiting; b, seed 1 waiting')
  _write_rows(first[0], 10)  # finished
  _write_rows(first[1], 4)  # under way
  (first[2]).mkdir(parents=True)
  (first[2] / 'metrics.csv').write_text('round,seconds\n')  # the header alone
  assert re.fullmatch(
    r'grid, 0 min \d+ s: a 14 of 30 rounds; b, seed 1 waiting', progress.line()
  ), progress.line()
  _write_rows(first[1], 7)  # the file grows as the run goes
  progress.done(1)
  assert progress.line().endswith(': a 17 of 30 rounds; b, seed 1 done')


def test_runs_being_replaced_count_once_rewritten(tmp_path):
  """With --overwrite, a run's old metrics.csv is not this grid's progress (the line
  read 7,816 of 8,100 rounds at 30 s, then went down as the runs restarted)."""
  runs = [tmp_path / f'run_{k}' for k in range(2)]
  for run in runs:
    _write_rows(run, 10)
    os.utime(run / 'metrics.csv', (0, 1_000_000))  # from an earlier grid
  assert grid_progress.GridProgress(['a'], [runs], 10).line().endswith(': a 20 of 20 rounds')
  replacing = grid_progress.GridProgress(['a'], [runs], 10, replacing=True)
  assert replacing.line().endswith(': a waiting')
  _write_rows(runs[0], 3)  # rewritten by this grid
  assert replacing.line().endswith(': a 3 of 20 rounds')


def test_the_last_round_is_read_from_the_end_of_a_long_file(tmp_path):
  run = tmp_path / 'run'
  _write_rows(run, 20_000)  # far more than the tail read
  assert grid_progress.last_round(run / 'metrics.csv') == 20_000
  assert grid_progress.last_round(tmp_path / 'none' / 'metrics.csv') == 0


@pytest.mark.slow  # a grid of processes; the progress it reads: the tests above
def test_a_grid_in_other_processes_says_its_progress_as_it_runs(tmp_path, capsys):
  spec = reproductions.Reproduction(
    task='quadratic',
    algorithms=('fedavg', 'fedprox'),
    client_learning_rates=(0.01,),
    server_learning_rates=(1.0,),
    rounds=3,
    checkpoints=(3,),
    metric='distance_to_optimum',
    higher_is_better=False,
    eval_period=3,
  )
  grid.run_grid('progress', spec, 3, (0,), tmp_path, parallel=2, progress_every=0.2)
  lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith('grid, ')]
  # The spawned processes take seconds to start: the line is said meanwhile.
  assert lines, 'no progress line'
  unit = r'(waiting|[0-3] of 3 rounds|done)'
  for line in lines:
    assert re.fullmatch(rf'grid, \d+ min \d+ s: fedavg {unit}; fedprox {unit}', line), line


def test_a_grids_default_processes_are_bounded_by_cores_units_and_memory(monkeypatch):
  def grid(algorithms: int, **memory) -> reproductions.Reproduction:
    return reproductions.Reproduction(
      task='quadratic',
      algorithms=tuple(f'a{i}' for i in range(algorithms)),
      client_learning_rates=(0.1,),
      server_learning_rates=(1.0,),
      rounds=1,
      checkpoints=(1,),
      metric='objective',
      **memory,
    )

  monkeypatch.setattr(os, 'sched_getaffinity', lambda pid: set(range(8)))
  monkeypatch.setattr(grid_processes, '_available_bytes', lambda: 64 * 2**30)
  assert grid_processes.default_processes(grid(4), 3, batch_trials=True) == (
    4,
    '4 unit(s) on 4 process(es): one a core (8), at most one a unit',
  )
  # Without batched trials every (algorithm, seed) is a unit.
  assert grid_processes.default_processes(grid(4), 5, batch_trials=False)[0] == 8
  monkeypatch.setattr(grid_processes, '_available_bytes', lambda: 4 * 2**30)  # 1.5 GB a process
  assert grid_processes.default_processes(grid(20), 1, batch_trials=True) == (
    2,
    '20 unit(s) on 2 process(es): one a core (8), at most one a unit, as many as 4.0 GB'
    ' available hold at 1.5 GB each',
  )
  # A grid that declares its processes' peak (the DP-at-scale grids: 9 GB) gets fewer.
  monkeypatch.setattr(grid_processes, '_available_bytes', lambda: 20 * 2**30)
  assert grid_processes.default_processes(grid(5), 3, batch_trials=True)[0] == 5
  assert grid_processes.default_processes(grid(5, process_gb=9), 3, batch_trials=True)[0] == 2
  monkeypatch.setattr(grid_processes, '_available_bytes', lambda: 2**20)
  assert grid_processes.default_processes(grid(20), 1, batch_trials=True)[0] == 1
  monkeypatch.setattr(grid_processes, '_available_bytes', lambda: None)  # no /proc/meminfo
  assert grid_processes.default_processes(grid(20), 1, batch_trials=True)[0] == 8


def test_the_available_memory_is_read_from_the_kernel():
  assert 0 < grid_processes._available_bytes() < 2**50
