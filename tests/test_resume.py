"""Checkpoints and --resume: an interrupted run, resumed, ends exactly as an
uninterrupted one; metrics.csv and TensorBoard hold every round once."""

import csv
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tff_comp import experiment

ARGS = dict(algorithm='feddualavg', task='quadratic', rounds=9, eval_period=3, checkpoint_every=3)


def _rows(path):
  with open(path / 'metrics.csv', newline='') as f:
    return [{k: v for k, v in r.items() if k not in ('seconds', 'seconds_per_round')}
            for r in csv.DictReader(f)]


def _model(path):
  with np.load(path / 'final_model.npz') as f:
    return [f[k] for k in sorted(f.files)]


def _train(path, interrupt_at=None, **kwargs):
  prepared = experiment.prepare(experiment.ExperimentConfig(
      output_dir=str(path), **dict(ARGS, **kwargs)))
  runner = experiment.build_runner(prepared)
  if interrupt_at is not None:
    process, calls = runner.runtime, []

    class Interrupted:  # the process, with a Ctrl-C in round `interrupt_at`
      def __getattr__(self, name):
        return getattr(process, name)

      def next(self, state, ids, work=None):
        calls.append(1)
        if len(calls) == interrupt_at:
          raise KeyboardInterrupt
        return process.next(state, ids, work)

    runner.runtime = Interrupted()
  return experiment.train(prepared, runner, show_progress=False)


@pytest.fixture(scope='module')
def uninterrupted(tmp_path_factory):
  path = tmp_path_factory.mktemp('whole')
  _train(path)
  return path


def test_resume_after_an_interruption_equals_an_uninterrupted_run(tmp_path, uninterrupted):
  with pytest.raises(KeyboardInterrupt):
    _train(tmp_path, interrupt_at=5)  # rounds 1-4 done, checkpoint at 3
  assert [r['round'] for r in _rows(tmp_path)] == ['0', '1', '2', '3', '4']
  with pytest.raises(experiment.ConfigError, match='pass --resume to continue it'):
    _train(tmp_path)
  with pytest.raises(experiment.ConfigError, match=r'configured differently \(seed\)'):
    _train(tmp_path, resume=True, seed=1)
  _train(tmp_path, resume=True)
  assert _rows(tmp_path) == _rows(uninterrupted)  # round 4 redone, never twice
  for a, b in zip(_model(tmp_path), _model(uninterrupted)):
    np.testing.assert_array_equal(a, b)
  events = list((tmp_path / 'tensorboard').glob('events.out.tfevents.*'))
  assert len(events) == 1  # rewritten from the kept rows, no stale file


# Part of the population each round (Poisson), a third dropping out, stragglers.
_PARTIAL = dict(sampling='poisson', clients_per_round=3, dropout_rate=0.3,
                straggler_rate=0.4, straggler_work=0.5)


def test_resume_replays_partial_participation_dropout_and_stragglers(tmp_path):
  """The resumed rounds draw the same cohorts, dropouts and stragglers as the
  uninterrupted run (the other tests here train every client every round, which a
  sampler replayed from round 0 would pass)."""
  whole = tmp_path / 'whole'
  _train(whole, **_PARTIAL)
  rows = _rows(whole)
  sampled = {r['participation/sampled'] for r in rows[1:]}
  assert len(sampled) > 1, sampled  # cohorts of several sizes
  assert any(r['participation/reporting'] != r['participation/sampled'] for r in rows[1:])
  assert any(float(r['participation/straggling'] or 0) > 0 for r in rows[1:])
  with pytest.raises(KeyboardInterrupt):
    _train(tmp_path / 'cut', interrupt_at=5, **_PARTIAL)
  _train(tmp_path / 'cut', resume=True, **_PARTIAL)
  assert _rows(tmp_path / 'cut') == rows
  for a, b in zip(_model(tmp_path / 'cut'), _model(whole), strict=True):
    np.testing.assert_array_equal(a, b)


def test_resume_can_extend_a_finished_run(tmp_path, uninterrupted):
  _train(tmp_path, rounds=6)
  _train(tmp_path, resume=True)
  assert _rows(tmp_path) == _rows(uninterrupted)


def test_sigkill_then_resume_from_the_command_line(repo_root, tmp_path):
  args = [sys.executable, str(repo_root / 'binaries' / 'run.py'), '--algo=feddualavg',
          '--task=quadratic', '--rounds=30', '--eval_period=3', '--checkpoint_every=3',
          f'--output_dir={tmp_path / "killed"}']
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3')
  proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                          env=env, cwd=repo_root)
  try:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not list(
        (tmp_path / 'killed' / 'checkpoints').glob('program_state_*')):
      time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
  finally:
    proc.kill()
  assert not (tmp_path / 'killed' / 'final_model.npz').exists()  # killed mid-run
  out = subprocess.run(args + ['--resume'], capture_output=True, text=True, env=env,
                       cwd=repo_root, timeout=300, stdin=subprocess.DEVNULL)
  assert out.returncode == 0, out.stderr
  _train(tmp_path / 'whole', rounds=30)
  assert _rows(tmp_path / 'killed') == _rows(tmp_path / 'whole')
