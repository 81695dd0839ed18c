"""Checkpoints and --resume: an interrupted run, resumed, ends exactly as an
uninterrupted one; metrics.csv and TensorBoard hold every round once."""

import csv
import errno
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

from tests import cli_driver, interrupted
from tff_comp import experiment
from tff_comp.run import outputs, training_loop

ARGS = dict(algorithm='feddualavg', task='quadratic', rounds=9, eval_period=3, checkpoint_every=3)
ARGS_RATE = 0.02  # a client rate given explicitly (recorded as given)


def _rows(path):
  with open(path / 'metrics.csv', newline='') as f:
    return [
      {k: v for k, v in r.items() if k not in ('seconds', 'seconds_per_round', 'eval/seconds')}
      for r in csv.DictReader(f)
    ]


def _events(path) -> dict[int, float]:
  """{round: training loss} in the TensorBoard events under `path` (each round once)."""
  losses = {}
  for file in (path / 'tensorboard').glob('events.out.tfevents.*'):
    for event in tf.compat.v1.train.summary_iterator(str(file)):
      for value in event.summary.value:
        if value.tag == 'train/client_work/train_loss':
          assert event.step not in losses, f'round {event.step} twice'
          losses[event.step] = float(tf.make_ndarray(value.tensor))
  return losses


def _csv_losses(path) -> dict[int, float]:
  with open(path / 'metrics.csv', newline='') as f:
    return {
      int(r['round']): float(np.float32(r['train/client_work/train_loss']))
      for r in csv.DictReader(f)
      if r['train/client_work/train_loss']
    }


def _saved_rounds(path) -> list[int]:
  return sorted(int(p.stem.split('_')[1]) for p in (path / 'checkpoints').glob('state_*.npz'))


def _model(path):
  return list(outputs.load_model(path / 'final_model.npz').trainable)


def _train(path, interrupt_at=None, show=False, **kwargs):
  config = experiment.ExperimentConfig.of(output_dir=str(path), **dict(ARGS, **kwargs))
  return interrupted.train(config, interrupt_at, show)


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
  with pytest.raises(
    experiment.ConfigError,
    match=r'configured differently \(seed: recorded 0, now 1\);.* or delete .+ to start it afresh',
  ):
    _train(tmp_path, resume=True, seed=1)
  _train(tmp_path, resume=True)
  assert _rows(tmp_path) == _rows(uninterrupted)  # round 4 redone, never twice
  for a, b in zip(_model(tmp_path), _model(uninterrupted)):
    np.testing.assert_array_equal(a, b)
  events = list((tmp_path / 'tensorboard').glob('events.out.tfevents.*'))
  assert len(events) == 1  # rewritten from the kept rows, no stale file


def test_a_run_recorded_in_the_earlier_flat_layout_resumes_and_reruns(tmp_path, uninterrupted):
  """0.3.0-dev recorded the client's settings at config.json's top level; they now live
  in `local_work`, and it had no `devices` record. Such a run still resumes (and a
  changed one is still refused), and its config.json still reruns with those settings."""
  with pytest.raises(KeyboardInterrupt):
    _train(tmp_path, interrupt_at=5, client_learning_rate=ARGS_RATE)
  path = tmp_path / 'config.json'
  config = json.loads(path.read_text())
  config.update(config.pop('local_work'))  # the earlier layout
  del config['devices']
  path.write_text(json.dumps(config))
  rerun = experiment.ExperimentConfig.from_dict(config)
  assert rerun.local_work.client_learning_rate == ARGS_RATE
  with pytest.raises(experiment.ConfigError, match=r'local_work\.batch_size: recorded'):
    _train(tmp_path, resume=True, client_learning_rate=ARGS_RATE, batch_size=3)
  _train(tmp_path, resume=True, client_learning_rate=ARGS_RATE)
  assert json.loads(path.read_text())['local_work']['client_learning_rate'] == ARGS_RATE


def test_a_run_recording_the_aggregator_under_privacy_resumes_and_reruns(tmp_path):
  """Before 0.3.0's move, config.json held `--aggregator` in the `privacy` record; it is
  now the aggregation's. Such a run resumes, a changed aggregator is still refused, and
  its config.json reruns with the aggregator it ran."""
  clipped = dict(aggregator='clip', clip_norm=0.5)
  with pytest.raises(KeyboardInterrupt):
    _train(tmp_path, interrupt_at=5, **clipped)
  path = tmp_path / 'config.json'
  config = json.loads(path.read_text())
  config['privacy']['aggregator'] = config['aggregation'].pop('aggregator')  # the old layout
  path.write_text(json.dumps(config))
  rerun = experiment.ExperimentConfig.from_dict(config)
  assert rerun.aggregation.aggregator == 'clip' and rerun.privacy.clip_norm == 0.5
  with pytest.raises(experiment.ConfigError, match=r'aggregation\.aggregator: recorded'):
    _train(tmp_path, resume=True, aggregator='median', clip_norm=None)
  _train(tmp_path, resume=True, **clipped)
  assert json.loads(path.read_text())['aggregation']['aggregator'] == 'clip'


# Part of the population each round (Poisson), a third dropping out, stragglers.
_PARTIAL = dict(
  sampling='poisson', clients_per_round=3, dropout_rate=0.3, straggler_rate=0.4, straggler_work=0.5
)


def test_a_resume_with_an_algorithm_option_changed_in_config_json_is_refused(tmp_path):
  """The algorithm's own options are compared one by one, and the refusal names the one
  that differs (a changed resolved option was accepted when only top-level settings
  were compared)."""
  with pytest.raises(KeyboardInterrupt):
    _train(tmp_path, interrupt_at=3)
  path = tmp_path / 'config.json'
  config = json.loads(path.read_text())
  options = config['resolved']['algorithm_options']
  name = sorted(options)[0]
  options[name] = 0.123
  path.write_text(json.dumps(config))
  with pytest.raises(
    experiment.ConfigError, match=rf'algorithm_options\.{name}: recorded 0\.123, now '
  ):
    _train(tmp_path, resume=True)


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


def test_resume_with_no_run_there_starts_one_and_says_so(tmp_path, capsys):
  _train(tmp_path / 'new', rounds=1, resume=True, show=True)
  assert 'resuming: no run here yet, starting from round 0' in capsys.readouterr().out
  assert [r['round'] for r in _rows(tmp_path / 'new')] == ['0', '1']


def test_resume_can_extend_a_finished_run(tmp_path, uninterrupted, capsys):
  """A finished run of 7 rounds (not a multiple of the checkpoint interval, 3) saved
  its last round; resumed as it was it says it has nothing left, and the extension says
  it resumes from there."""
  _train(tmp_path, rounds=7)
  assert (tmp_path / 'checkpoints' / 'state_7.npz').is_file()
  finished = _rows(tmp_path)
  capsys.readouterr()
  _train(tmp_path, rounds=7, resume=True, show=True)
  assert 'the run had reached its 7 rounds (a larger --rounds extends it)' in (
    capsys.readouterr().out
  )
  assert _rows(tmp_path) == finished
  _train(tmp_path, resume=True, show=True)
  assert 'resuming from round 7' in capsys.readouterr().out
  # Round 7 was the 7-round run's last, so it holds an evaluation the 9-round run's lacks.
  without_eval = lambda rows: [
    {k: v for k, v in r.items() if not k.startswith('eval/')} if r['round'] == '7' else r
    for r in rows
  ]
  assert without_eval(_rows(tmp_path)) == without_eval(_rows(uninterrupted))


def test_an_interrupt_saves_the_last_finished_round(tmp_path, uninterrupted):
  with pytest.raises(training_loop.Interrupted) as stopped:
    _train(tmp_path, interrupt_at=6)  # in round 6: rounds 1-5 done, checkpoints at 3
  assert stopped.value.saved_round == 5
  assert (tmp_path / 'checkpoints' / 'state_5.npz').is_file()
  _train(tmp_path, resume=True)
  assert _rows(tmp_path) == _rows(uninterrupted)


def _damage(path: pathlib.Path, how: str) -> None:
  data = path.read_bytes()
  path.write_bytes(
    data[: len(data) // 2]
    if how == 'truncated'
    else bytes(b ^ 0x5A for b in data)
    if how == 'garbled'
    else bytes(len(data))
  )


@pytest.mark.parametrize('how', ['truncated', 'garbled', 'zeroed'])
def test_a_damaged_newest_checkpoint_is_set_aside_and_the_run_resumes_past_it(
  tmp_path, uninterrupted, caplog, how
):
  with pytest.raises(training_loop.Interrupted):
    _train(tmp_path, interrupt_at=8)  # checkpoints at 6 and 7 (the interrupt's)
  _damage(tmp_path / 'checkpoints' / 'state_7.npz', how)
  _train(tmp_path, resume=True)  # from round 6; saves round 7 again on the way
  assert 'checkpoint of round 7 is damaged' in caplog.text
  assert list((tmp_path / 'checkpoints_damaged').glob('state_7.*.npz'))
  assert _rows(tmp_path) == _rows(uninterrupted)
  for a, b in zip(_model(tmp_path), _model(uninterrupted), strict=True):
    np.testing.assert_array_equal(a, b)


def test_a_checkpoint_damaged_twice_is_set_aside_twice(tmp_path, uninterrupted):
  """Each damaged checkpoint is set aside under a name of its own: the second of the
  same round no longer fails moving onto the first (OSError: Directory not empty)."""
  with pytest.raises(training_loop.Interrupted):
    _train(tmp_path, interrupt_at=8)  # checkpoints at 6 and 7 (the interrupt's)
  _damage(tmp_path / 'checkpoints' / 'state_7.npz', 'garbled')
  with pytest.raises(training_loop.Interrupted):
    _train(tmp_path, resume=True, interrupt_at=2)  # from 6; round 7 saved again
  _damage(tmp_path / 'checkpoints' / 'state_7.npz', 'truncated')
  _train(tmp_path, resume=True)
  assert len(list((tmp_path / 'checkpoints_damaged').glob('state_7.*.npz'))) == 2
  assert _rows(tmp_path) == _rows(uninterrupted)
  for a, b in zip(_model(tmp_path), _model(uninterrupted), strict=True):
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize('source', ['another_round', 'another_run'])
def test_a_checkpoint_of_another_state_than_its_name_is_set_aside(
  tmp_path, uninterrupted, caplog, source
):
  """A checkpoint file holding another round's state (state_6 copied over state_7), or
  another run's state of its round, is set aside as a damaged one and the run resumes
  from the one before it (it was resumed as the round of its name: other rows, another
  model)."""
  with pytest.raises(training_loop.Interrupted):
    _train(tmp_path, interrupt_at=8)  # checkpoints at 6 and 7 (the interrupt's)
  newest = tmp_path / 'checkpoints' / 'state_7.npz'
  if source == 'another_round':
    shutil.copy(tmp_path / 'checkpoints' / 'state_6.npz', newest)
    expected = 'holds the state of round 6, not of round 7'
  else:
    with pytest.raises(training_loop.Interrupted):
      _train(tmp_path / 'other', interrupt_at=8, client_learning_rate=ARGS_RATE)
    shutil.copy(tmp_path / 'other' / 'checkpoints' / 'state_7.npz', newest)
    expected = "another run's checkpoint"
  _train(tmp_path, resume=True)
  assert 'checkpoint of round 7 is damaged' in caplog.text and expected in caplog.text
  assert list((tmp_path / 'checkpoints_damaged').glob('state_7.*.npz'))
  assert _rows(tmp_path) == _rows(uninterrupted)
  for a, b in zip(_model(tmp_path), _model(uninterrupted), strict=True):
    np.testing.assert_array_equal(a, b)


def test_an_input_file_changed_before_a_resume_is_refused_naming_it(tmp_path):
  """A device trace edited between a run and its --resume is refused in one line naming
  it, with nothing of the run touched (the resumed rounds trained on the new trace)."""
  ids = experiment.prepare(
    experiment.ExperimentConfig.of(output_dir=str(tmp_path / 'probe'), **ARGS)
  ).task.train_data.client_ids
  trace = tmp_path / 't.csv'
  trace.write_text('client_id,speed,network_seconds\n' + ''.join(f'{cid},100,1\n' for cid in ids))
  run = tmp_path / 'run'
  devices = dict(device_model='trace', device_trace=str(trace), round_deadline=1.5)
  with pytest.raises(training_loop.Interrupted):
    _train(run, interrupt_at=5, **devices)
  recorded = json.loads((run / 'config.json').read_text())['environment']['data_files']
  assert set(recorded) == {str(trace)}
  before = {p: p.read_bytes() for p in run.rglob('*') if p.is_file()}
  trace.write_text(trace.read_text().replace(',100,', ',1000,'))
  with pytest.raises(
    experiment.ConfigError,
    match=rf'--resume: {trace}, an input of the'
    r' run in .*, changed since the run was recorded \(.*\)',
  ):
    _train(run, resume=True, **devices)
  assert {p: p.read_bytes() for p in run.rglob('*') if p.is_file()} == before
  trace.write_text(trace.read_text().replace(',1000,', ',100,'))
  _train(run, resume=True, **devices)  # restored: resumed


def test_an_input_file_named_by_another_path_is_the_same_input(tmp_path, monkeypatch):
  """A device trace named 't.csv' from one folder resumes named by its absolute path from
  another: inputs compare by content, not by the path naming them (#76); one whose
  content changed is still refused."""
  ids = experiment.prepare(
    experiment.ExperimentConfig.of(output_dir=str(tmp_path / 'probe'), **ARGS)
  ).task.train_data.client_ids
  (tmp_path / 'a').mkdir()
  trace = tmp_path / 'a' / 't.csv'
  trace.write_text('client_id,speed,network_seconds\n' + ''.join(f'{cid},100,1\n' for cid in ids))
  run = tmp_path / 'run'
  monkeypatch.chdir(tmp_path / 'a')
  with pytest.raises(training_loop.Interrupted):
    _train(run, interrupt_at=5, device_model='trace', device_trace='t.csv', round_deadline=1.5)
  monkeypatch.chdir(tmp_path)
  elsewhere = dict(device_model='trace', device_trace=str(trace), round_deadline=1.5)
  edited = tmp_path / 'edited.csv'
  edited.write_text(trace.read_text().replace(',100,', ',1000,'))
  with pytest.raises(experiment.ConfigError, match='changed since the run was recorded'):
    _train(run, resume=True, **dict(elsewhere, device_trace=str(edited)))
  _train(run, resume=True, **elsewhere)
  assert _rows(run)[-1]['round'] == str(ARGS['rounds'])


def test_temporary_files_a_kill_left_are_removed_when_the_run_resumes(tmp_path, uninterrupted):
  with pytest.raises(training_loop.Interrupted):
    _train(tmp_path, interrupt_at=5)
  stale = [
    tmp_path / '.metrics.csv.k1ll',
    tmp_path / '.config.json.k1ll',
    tmp_path / 'checkpoints' / '.state_4.999.npz',
  ]
  for path in stale:
    path.write_text('cut short')
  _train(tmp_path, resume=True)
  assert not [path for path in stale if path.exists()]
  assert _rows(tmp_path) == _rows(uninterrupted)


def test_a_kill_while_rewriting_metrics_leaves_the_old_file_whole(tmp_path, monkeypatch):
  """Resuming rewrites metrics.csv from the rows it keeps: into a new file renamed over
  the old one, so a kill in the middle loses nothing."""
  with pytest.raises(training_loop.Interrupted):
    _train(tmp_path, interrupt_at=6)
  before = (tmp_path / 'metrics.csv').read_bytes()

  def killed(self, rows):
    del self, rows
    raise SystemExit('killed while writing')

  monkeypatch.setattr(outputs.csv.DictWriter, 'writerows', killed)
  with pytest.raises(SystemExit):
    _train(tmp_path, resume=True)
  assert (tmp_path / 'metrics.csv').read_bytes() == before


def test_a_locked_output_directory_is_refused_naming_the_holder(tmp_path):
  with outputs.output_lock(tmp_path):
    with pytest.raises(
      experiment.ConfigError, match=rf'in use by another run \(pid {os.getpid()}\)'
    ):
      _train(tmp_path)
  _train(tmp_path, rounds=1)  # released


# A kill's leftovers in process: test_temporary_files_a_kill_left_are_removed_when_the_run_resumes.
@pytest.mark.slow
def test_sigkill_then_resume_from_the_command_line(repo_root, tmp_path):
  # Long enough to be killed a few checkpoints in, whatever the machine's speed.
  settings = dict(rounds=1000, eval_period=50, checkpoint_every=10)
  args = [
    sys.executable,
    str(repo_root / 'binaries' / 'run.py'),
    '--algo=feddualavg',
    '--task=quadratic',
    f'--output_dir={tmp_path / "killed"}',
    *(f'--{k}={v}' for k, v in settings.items()),
  ]
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3')
  proc = subprocess.Popen(
    args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=repo_root
  )
  try:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and max(_saved_rounds(tmp_path / 'killed'), default=0) < 30:
      time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
  finally:
    proc.kill()
  killed = tmp_path / 'killed'
  assert not (killed / 'final_model.npz').exists()  # killed mid-run
  # Rows are buffered, but every round up to the newest checkpoint was written, to the
  # CSV and to TensorBoard, before the checkpoint was.
  newest = _saved_rounds(killed)[-1]
  for written in (_csv_losses(killed), _events(killed)):
    assert set(range(1, newest + 1)) <= set(written), (newest, sorted(written))
  out = subprocess.run(
    args + ['--resume'],
    capture_output=True,
    text=True,
    env=env,
    cwd=repo_root,
    timeout=300,
    stdin=subprocess.DEVNULL,
  )
  assert out.returncode == 0, out.stderr
  _train(tmp_path / 'whole', **settings)
  assert _rows(killed) == _rows(tmp_path / 'whole')
  assert _events(killed) == _csv_losses(killed) == _events(tmp_path / 'whole')
  assert sorted(_events(killed)) == list(range(1, 1001))


def _rows_until(path, rounds: int) -> int:
  """Waits until metrics.csv of a running run holds `rounds` rounds."""
  deadline = time.monotonic() + 120
  while time.monotonic() < deadline:
    try:
      if len((path / 'metrics.csv').read_text().splitlines()) > rounds + 1:
        return
    except FileNotFoundError:
      pass
    time.sleep(0.05)
  raise AssertionError(f'{path} did not reach round {rounds}')


# Ctrl-C's one-line stop is also test_run_binary.py's; its resume here is slow-suite.
@pytest.mark.parametrize(
  'sig,code,says',
  [
    pytest.param(signal.SIGINT, 130, 'interrupted', marks=pytest.mark.slow),
    (signal.SIGTERM, 143, 'terminated (SIGTERM)'),
  ],
)
def test_a_signal_saves_the_last_round_and_locks_out_a_second_run(
  repo_root, tmp_path, sig, code, says
):
  """Ctrl-C and SIGTERM (a scheduler's preemption) save the last finished round;
  --resume continues from it bit for bit. While the run lives, its directory is locked
  under its pid (a second run's one-line refusal: test_run_binary.py)."""
  # One engine for every run compared (auto would pick by each run's length).
  run = [
    sys.executable,
    str(repo_root / 'binaries' / 'run.py'),
    '--algo=feddualavg',
    '--task=quadratic',
    '--eval_period=3',
    '--checkpoint_every=1000',
    '--engine=mapped',
    f'--output_dir={tmp_path / "run"}',
  ]
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3')
  proc = subprocess.Popen(
    run + ['--rounds=100000'],
    stdout=subprocess.DEVNULL,
    stderr=subprocess.PIPE,
    text=True,
    env=env,
    cwd=repo_root,
  )
  try:
    # Round 2's row (in the first 2-second flush after round 1's, written at once):
    # round 1 has passed all its callbacks, so the signal saves a round >= 1.
    _rows_until(tmp_path / 'run', 2)
    with pytest.raises(outputs.OutputDirInUse, match=rf'\(pid {proc.pid}\)'):
      with outputs.output_lock(tmp_path / 'run'):
        pass
    proc.send_signal(sig)
    _, stderr = proc.communicate(timeout=60)
  finally:
    proc.kill()
  assert proc.returncode == code, stderr
  line = stderr.strip().splitlines()[-1]
  saved = int(line.split('saved the state of round ')[1].split(',')[0])
  # A round's row is written before its last callbacks run: a signal among them saves
  # the round before, the last round every callback saw.
  assert line.startswith(f'run.py: {says}; ') and saved >= 1, line
  # Every finished round's row is in metrics.csv and in TensorBoard's events: buffered
  # rows are written when the run stops.
  written = _csv_losses(tmp_path / 'run')
  assert sorted(written) in (list(range(1, saved + 1)), list(range(1, saved + 2)))
  assert _events(tmp_path / 'run') == written
  # Resumed here (run.py's --resume: test_resume_from_the_command_line_...).
  _train(tmp_path / 'run', rounds=saved + 3, engine='mapped', resume=True, checkpoint_every=1000)
  _train(tmp_path / 'whole', rounds=saved + 3, engine='mapped')
  assert _rows(tmp_path / 'run') == _rows(tmp_path / 'whole')
  assert _events(tmp_path / 'run') == _csv_losses(tmp_path / 'run')
  for a, b in zip(_model(tmp_path / 'run'), _model(tmp_path / 'whole'), strict=True):
    np.testing.assert_array_equal(a, b)


def _lines(path) -> list[str]:
  return (path / 'metrics.csv').read_text().splitlines(keepends=True)


def _rewrite(path, lines) -> None:
  (path / 'metrics.csv').write_text(''.join(lines))


# metrics.csv damaged after a run saved rounds 6 and 7 (rows 0-7): each way leaves no
# whole rows up to either checkpoint. Line 0 is the header, line r + 1 round r's row.
_LOST = {
  'header only': (lambda path: _rewrite(path, _lines(path)[:1]), 'without a whole row'),
  'emptied': (lambda path: _rewrite(path, []), r'without a whole row \(its header'),
  'deleted': (lambda path: (path / 'metrics.csv').unlink(), r'missing'),
  'row 3 garbled': (
    lambda path: _rewrite(path, [*_lines(path)[:4], '3x,#!\n', *_lines(path)[5:]]),
    r'whole up to round 2 only \(the row of round 3 \(line 5\) is damaged',
  ),
  'row 5 gone': (
    lambda path: _rewrite(path, [*_lines(path)[:6], *_lines(path)[7:]]),
    r'whole up to round 4 only \(no row for round 5\)',
  ),
}


@pytest.mark.parametrize('how', list(_LOST))
def test_a_resume_refuses_when_metrics_csv_lost_the_saved_rounds(tmp_path, how):
  """metrics.csv cut, emptied, deleted or damaged before the checkpoints' rounds: the
  resume refuses in one line naming the file, and deletes no checkpoint."""
  with pytest.raises(training_loop.Interrupted):
    _train(tmp_path, interrupt_at=8)  # rows 0-7, checkpoints at 6 and 7
  damage, reason = _LOST[how]
  damage(tmp_path)
  with pytest.raises(
    experiment.ConfigError,
    match=f'--resume: .*metrics.csv is {reason}.*saved rounds \\(6, 7\\).*--overwrite',
  ):
    _train(tmp_path, resume=True)
  assert _saved_rounds(tmp_path) == [6, 7]


def test_a_cut_last_row_runs_again_from_the_checkpoint_before_it(tmp_path, uninterrupted, caplog):
  """Round 7's row cut in half: rows 0-6 are whole, so the run resumes from round 6's
  checkpoint and ends as an uninterrupted one."""
  with pytest.raises(training_loop.Interrupted):
    _train(tmp_path, interrupt_at=8)
  lines = _lines(tmp_path)
  _rewrite(tmp_path, [*lines[:-1], lines[-1][: len(lines[-1]) // 2]])
  _train(tmp_path, resume=True)
  assert 'whole up to round 6 only' in caplog.text
  assert _rows(tmp_path) == _rows(uninterrupted)
  for a, b in zip(_model(tmp_path), _model(uninterrupted), strict=True):
    np.testing.assert_array_equal(a, b)


def test_a_run_without_its_config_json_resumes_only_when_forced(tmp_path, uninterrupted):
  with pytest.raises(training_loop.Interrupted):
    _train(tmp_path, interrupt_at=5)
  (tmp_path / 'config.json').unlink()
  with pytest.raises(experiment.ConfigError, match='not its config.json.*--force_resume'):
    _train(tmp_path, resume=True, seed=1)
  assert _saved_rounds(tmp_path) == [3, 4]
  _train(tmp_path, resume=True, force_resume=True)
  assert _rows(tmp_path) == _rows(uninterrupted)
  assert json.loads((tmp_path / 'config.json').read_text())['force_resume'] is True
  with pytest.raises(experiment.ConfigError, match='--force_resume goes with --resume'):
    experiment.prepare(experiment.ExperimentConfig.of(algorithm='fedavg', force_resume=True))


def test_a_lock_that_is_a_directory_is_one_line(tmp_path):
  (tmp_path / '.lock').mkdir()
  with pytest.raises(
    experiment.ConfigError,
    match=r'lock file .*\.lock cannot be opened'
    r' \(Is a directory\)',
  ):
    _train(tmp_path)


def test_an_output_dir_the_os_refuses_is_one_line(tmp_path, monkeypatch):
  """A refusal the checks before cannot foresee (a full disk here; root under /proc)."""

  def full(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

  monkeypatch.setattr(pathlib.Path, 'mkdir', full)
  with pytest.raises(
    experiment.ConfigError,
    match=r'^--output_dir=.*/new cannot be created \(No space left on device\)\.$',
  ):
    _train(tmp_path / 'new')


def test_the_run_files_take_the_umask_mode_not_a_temporary_files(tmp_path):
  """metrics.csv and config.json were 0600 (written through temporary files) beside
  0644 files."""
  _train(tmp_path, rounds=1)
  expected = 0o666 & ~outputs._UMASK
  for name in ('metrics.csv', 'config.json'):
    assert (tmp_path / name).stat().st_mode & 0o777 == expected, name


@pytest.mark.parametrize('how', ['earlier version', 'another layout'])
def test_a_checkpoint_of_another_layout_is_refused_not_set_aside(tmp_path, how):
  """Leaves of the same shapes in another order (the server state as an OrderedDict,
  sorted by key, before 0.3.0's NamedTuples) would resume silently wrong."""
  with pytest.raises(training_loop.Interrupted):
    _train(tmp_path, interrupt_at=8)  # checkpoints at 6 and 7
  path = tmp_path / 'checkpoints' / 'state_7.npz'
  with np.load(path) as saved:
    values = dict(saved)
  layout = list(values.pop('layout'))
  if how == 'another layout':
    values['layout'] = np.array([p.replace('finalizer/elapsed', 'finalizer/dual_') for p in layout])
  np.savez(path, **values)
  with pytest.raises(experiment.ConfigError, match=f'{how}.*--overwrite'):
    _train(tmp_path, resume=True)
  assert path.exists() and not (tmp_path / 'checkpoints_damaged').exists()


def _damages():
  """(name, how to damage a file): cut to half, garbled in the middle, emptied, removed."""

  def cut(p):
    p.write_bytes(p.read_bytes()[: len(p.read_bytes()) // 2])

  def garble(p):
    data = bytearray(p.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 16] = b'\xff' * min(16, len(data) - middle)
    p.write_bytes(bytes(data))

  return [
    ('cut', cut),
    ('garbled', garble),
    ('emptied', lambda p: p.write_bytes(b'')),
    ('removed', lambda p: p.unlink()),
  ]


@pytest.mark.slow
def test_battery_every_file_of_a_run_damaged_in_turn(tmp_path, uninterrupted):
  """Each file of a finished run directory damaged each way in turn, then --resume with
  more rounds: either the run ends as an uninterrupted one (its model and rows equal to
  the rounds both ran), or a one-line refusal that deleted nothing."""
  import shutil

  longer = tmp_path / 'longer'
  _train(longer, rounds=12)
  finished = tmp_path / 'finished'
  _train(finished)
  files = sorted(
    p.relative_to(finished) for p in finished.rglob('*') if p.is_file() and p.name != '.lock'
  )
  assert {'metrics.csv', 'config.json', 'final_model.npz'} <= {str(f) for f in files}
  outcomes = {}
  for relative in files:
    for how, damage in _damages():
      run = tmp_path / f'{str(relative).replace("/", "_")}-{how}'
      shutil.copytree(finished, run)
      damage(run / relative)
      before = sorted(str(p.relative_to(run)) for p in run.rglob('*') if p.is_file())
      try:
        _train(run, rounds=12, resume=True)
      except experiment.ConfigError as error:
        after = sorted(str(p.relative_to(run)) for p in run.rglob('*') if p.is_file())
        assert '\n' not in str(error), (relative, how, str(error))
        assert set(before) <= set(after), (relative, how, set(before) - set(after))
        outcomes[(str(relative), how)] = 'refused'
        continue
      np.testing.assert_array_equal(_model(run)[0], _model(longer)[0], err_msg=f'{relative} {how}')
      assert _csv_losses(run) == _csv_losses(longer), (relative, how)
      outcomes[(str(relative), how)] = 'resumed'
  # The battery met both outcomes (a vacuous battery would resume everything).
  assert set(outcomes.values()) == {'refused', 'resumed'}, outcomes


def test_keep_checkpoints_keeps_that_many_newest_and_may_change_on_resume(tmp_path, uninterrupted):
  """--keep_checkpoints (default 2) keeps that many of the newest checkpoints; a resume
  may change it, and the resumed run still equals the uninterrupted one."""
  with pytest.raises(training_loop.Interrupted):
    _train(tmp_path, interrupt_at=8, checkpoint_every=1, keep_checkpoints=5)
  assert _saved_rounds(tmp_path) == [3, 4, 5, 6, 7]
  _train(tmp_path, resume=True, checkpoint_every=1, keep_checkpoints=3)
  assert _saved_rounds(tmp_path) == [7, 8, 9]
  assert _rows(tmp_path) == _rows(uninterrupted)
  recorded = json.loads((tmp_path / 'config.json').read_text())['checkpoints']
  assert recorded == {'checkpoint_every': 1, 'keep_checkpoints': 3}


def test_resume_from_the_command_line_reads_the_recorded_settings(repo_root, tmp_path):
  """`run.py --resume --output_dir=D` alone continues D's run with the settings it
  recorded (algorithm, task, rates, cohort, seed), here extended by --rounds, and ends
  as an uninterrupted run of those settings (#76; a flag changing what cannot change is
  refused as before: test_a_resume_with_an_algorithm_option_changed_in_config_json_...)."""
  settings = dict(
    algo='fedavg',
    task='quadratic',
    client_learning_rate=0.05,
    clients_per_round=4,
    seed=3,
    checkpoint_every=2,
    eval_period=2,
  )

  first, resumed = cli_driver.run_all(  # [status, stdout, stderr] each, one interpreter
    [
      [*(f'--{k}={v}' for k, v in settings.items()), '--rounds=4', f'--output_dir={tmp_path}'],
      ['--resume', '--rounds=6', f'--output_dir={tmp_path}'],
    ],
    cwd=repo_root,
    env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3'),
  )
  assert first[0] == 0, first[2]
  assert resumed[0] == 0, resumed[2]
  assert resumed[1].startswith('fedavg on quadratic: 6 rounds, 4 clients/round'), resumed[1]
  assert 'eta_c=0.05' in resumed[1].splitlines()[0]
  whole = tmp_path / 'whole'
  experiment.train(
    'fedavg',
    'quadratic',
    output_dir=str(whole),
    show_progress=False,
    rounds=6,
    **{k: v for k, v in settings.items() if k not in ('algo', 'task')},
  )
  assert _rows(tmp_path) == _rows(whole)
  for a, b in zip(_model(tmp_path), _model(whole), strict=True):
    np.testing.assert_array_equal(a, b)
