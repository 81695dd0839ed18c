"""The training loop is a loop plus callbacks: a new sink or an early stop is one
callback, not an edit of the loop."""

import csv
import signal

import numpy as np
import pytest
import tensorflow as tf

from tests import algorithm_cases
from tff_comp import experiment, registry, signals
from tff_comp.run import callbacks, checkpoints, outputs, training_loop
from tff_comp.runtime import inprocess

DATA = algorithm_cases.DATA['unequal']


class _Sink(callbacks.Callback):
  """Collects each round's training loss."""

  def __init__(self):
    self.losses, self.ended = [], None

  def after_round(self, loop, round_num, metrics):
    self.losses.append((round_num, metrics['train/client_work/train_loss']))

  def on_train_end(self, loop, completed):
    self.ended = completed


class _StopBelow(callbacks.Callback):
  """Stops the run once the round's training loss is below `threshold`."""

  def __init__(self, threshold):
    self.threshold = threshold

  def after_round(self, loop, round_num, metrics):
    if metrics['train/client_work/train_loss'] < self.threshold:
      raise callbacks.StopTraining


def _run(tmp_path, callbacks, rounds=30):
  algorithm = registry.get_algorithm('fedavg').build(
    algorithm_cases.MODEL, **algorithm_cases.arguments('fedavg', {})
  )
  # Mapped: the loop and its callbacks, not the engines (lanes would compile a kernel a run).
  runtime = inprocess.build(algorithm, DATA, engine='mapped')
  return training_loop.run_simulation(
    runtime,
    client_ids=list(DATA.client_ids),
    rounds=rounds,
    clients_per_round=3,
    seed=0,
    output_dir=tmp_path,
    config={},
    show_progress=False,
    callbacks=training_loop.standard_callbacks(
      lambda _: {'x': 1.0}, eval_period=5, show_progress=False, extra=callbacks
    ),
  )


def test_a_sink_sees_every_round_and_an_early_stop_ends_the_run_cleanly(tmp_path):
  full = _Sink()
  _run(tmp_path / 'full', [full])
  assert [r for r, _ in full.losses] == list(range(1, 31)) and full.ended
  threshold = full.losses[9][1] + 1e-9  # reached first at some round <= 10
  stopped_at = next(r for r, loss in full.losses if loss < threshold)
  assert stopped_at < 30

  sink = _Sink()
  _run(tmp_path / 'stop', [_StopBelow(threshold), sink])
  assert [r for r, _ in sink.losses] == list(range(1, stopped_at + 1)) and sink.ended
  with open(tmp_path / 'stop' / 'metrics.csv', newline='') as f:
    rounds = [int(row['round']) for row in csv.DictReader(f)]
  assert rounds == list(range(stopped_at + 1))  # round 0, then every round run
  # The stop round is checkpointed and the model saved (checkpoint_every=50).
  saved, version = checkpoints.Checkpoints(tmp_path / 'stop').load_latest(
    inprocess.build(
      registry.get_algorithm('fedavg').build(
        algorithm_cases.MODEL, **algorithm_cases.arguments('fedavg', {})
      ),
      DATA,
    ).initialize()
  )
  assert version == stopped_at and saved is not None
  with np.load(tmp_path / 'stop' / 'final_model.npz') as f:
    assert sorted(f.files) == ['trainable_0', 'trainable_1']  # named by weight
  model = outputs.load_model(tmp_path / 'stop' / 'final_model.npz')
  assert [w.shape for w in model.trainable] == [(algorithm_cases.D,), ()]
  assert model.non_trainable == ()


class _HalveRateFromRound(callbacks.Callback):
  """Before each round from `start` on, halves the client learning rate in the state,
  noting the clients each round runs on."""

  def __init__(self, start):
    self.start, self.cohorts = start, []

  def before_round(self, loop, round_num, clients):
    self.cohorts.append((round_num, tuple(clients.reporting)))
    if round_num >= self.start:
      rate = loop.hparams['hparams/client_work/learning_rate'] / 2
      loop.state = callbacks.set_learning_rates(loop.runtime, loop.state, rate, 1.0)
      loop.hparams['hparams/client_work/learning_rate'] = rate


def test_before_round_sees_each_cohort_and_may_change_the_state(tmp_path):
  plain, halved = _Sink(), _HalveRateFromRound(start=3)
  _run(tmp_path / 'plain', [plain], rounds=4)
  _run(tmp_path / 'halved', [halved], rounds=4)
  assert [r for r, _ in halved.cohorts] == [1, 2, 3, 4]
  assert all(len(ids) == 3 for _, ids in halved.cohorts)
  with open(tmp_path / 'halved' / 'metrics.csv', newline='') as f:
    rows = list(csv.DictReader(f))
  rates = [float(row['hparams/client_work/learning_rate']) for row in rows[1:]]
  assert rates[2] == rates[1] / 2 and rates[3] == rates[1] / 4  # logged as set
  with open(tmp_path / 'plain' / 'metrics.csv', newline='') as f:
    plain_rows = list(csv.DictReader(f))
  losses = [row['train/client_work/train_loss'] for row in rows[1:]]
  assert losses[:2] == [row['train/client_work/train_loss'] for row in plain_rows[1:3]]
  assert losses[3] != plain_rows[4]['train/client_work/train_loss']  # the rate took effect


def test_train_from_code_takes_callbacks(tmp_path):
  sink = _Sink()
  experiment.train(
    'fedavg',
    'quadratic',
    rounds=3,
    clients_per_round=2,
    eval_period=3,
    output_dir=str(tmp_path),
    show_progress=False,
    callbacks=[sink],
  )
  assert [r for r, _ in sink.losses] == [1, 2, 3] and sink.ended


class _SignalAtStart(callbacks.Callback):
  """A Ctrl-C arriving while the run starts (its initial evaluation)."""

  def on_train_begin(self, loop):
    signals._request(signal.SIGINT, None)


def test_a_signal_while_the_run_starts_stops_it_before_its_first_round(tmp_path):
  """It ran the first round (a compile, minutes under load) and saved it."""
  sink = _Sink()
  with signals.stop_at_round_end(), pytest.raises(training_loop.Interrupted) as stopped:
    experiment.train(
      'fedavg',
      'quadratic',
      rounds=3,
      output_dir=str(tmp_path),
      show_progress=False,
      callbacks=[_SignalAtStart(), sink],
    )
  assert stopped.value.saved_round == 0 and sink.losses == []
  assert not list((tmp_path / 'checkpoints').glob('state_*'))


def test_a_run_is_the_callbacks_its_caller_composes(tmp_path):
  """The binaries compose `default_callbacks`; a list without the evaluator evaluates
  nothing, and the run directory's own callbacks still write every row."""
  prepared = experiment.prepare(
    experiment.ExperimentConfig.of(
      algorithm='fedavg',
      task='quadratic',
      rounds=3,
      clients_per_round=2,
      eval_period=1,
      output_dir=str(tmp_path),
      client_lr_schedule='exponential',
    )
  )
  runner = experiment.build_runner(prepared)
  composed = experiment.default_callbacks(prepared, runner, show_progress=False)
  assert [type(c).__name__ for c in composed] == [
    'Schedules',
    'DivergenceGuard',
    'Evaluator',
    'DivergenceGuard',
    'Communication',
    'Progress',
  ]
  kept = [c for c in composed if not isinstance(c, callbacks.Evaluator)]
  assert experiment.train_runner(prepared, runner, show_progress=False, callbacks=kept) == {}
  columns, rows, _ = outputs.whole_rows(tmp_path / 'metrics.csv')
  assert [row['round'] for row in rows] == ['0', '1', '2', '3']
  assert not [c for c in columns if c.startswith('eval/')]


def test_a_non_finite_evaluation_stops_the_run_before_it_is_saved(tmp_path):
  """The divergence guard reads the evaluation too: a model whose evaluated loss is
  infinite at round 10 is neither written nor checkpointed."""
  algorithm = registry.get_algorithm('fedavg').build(
    algorithm_cases.MODEL, **algorithm_cases.arguments('fedavg', {})
  )
  runtime = inprocess.build(algorithm, DATA)
  calls = []

  def evaluate(state):
    del state
    calls.append(1)
    return {'test_loss': float('inf') if len(calls) == 3 else 1.0}  # round 0, 5, 10

  with pytest.raises(callbacks.DivergenceError, match='round 10: eval/test_loss inf'):
    training_loop.run_simulation(
      runtime,
      client_ids=list(DATA.client_ids),
      rounds=20,
      clients_per_round=3,
      seed=0,
      output_dir=tmp_path,
      config={},
      show_progress=False,
      checkpoints=checkpoints.CheckpointOptions(checkpoint_every=5),
      callbacks=training_loop.standard_callbacks(evaluate, eval_period=5, show_progress=False),
    )
  assert checkpoints.Checkpoints(tmp_path).rounds() == [5]
  with open(tmp_path / 'metrics.csv', newline='') as f:
    assert [int(row['round']) for row in csv.DictReader(f)][-1] < 10


def test_the_first_trained_round_is_on_disk_at_once_then_rows_wait_for_the_flush(tmp_path):
  """metrics.csv shows a run has started training as soon as its first round ends; later
  rows are written together (every 2 s by default) and when the writer closes."""
  writer = outputs.MetricsWriter(tmp_path, ['loss'], flush_seconds=3600.0)

  def rounds():
    with open(tmp_path / 'metrics.csv', newline='') as f:
      return [int(row['round']) for row in csv.DictReader(f)]

  for round_num, expected in ((0, []), (1, [0, 1]), (2, [0, 1]), (3, [0, 1])):
    writer.write(round_num, 0.1, {'loss': 1.0})
    assert rounds() == expected, round_num
  writer.close()
  assert rounds() == [0, 1, 2, 3]


def test_tensorboard_events_hold_what_tf_summary_scalar_writes(tmp_path):
  """A round's metrics in TensorBoard's events as TensorFlow's own `tf.summary.scalar`
  writes them: the same tags, metadata and float32 tensors at the round's step (read back
  by TensorFlow's summary iterator)."""
  metrics = {'train/client_work/train_loss': 0.25, 'eval/accuracy': 0.5}
  (tmp_path / 'ours').mkdir()
  writer = outputs.MetricsWriter(tmp_path / 'ours', sorted(metrics))
  for round_num in (1, 2):
    writer.write(round_num, 0.1, {k: v * round_num for k, v in metrics.items()})
  writer.close()
  with tf.summary.create_file_writer(str(tmp_path / 'tf')).as_default() as tf_writer:
    for round_num in (1, 2):
      for tag, value in metrics.items():
        tf.summary.scalar(tag, value * round_num, step=round_num)
    tf_writer.flush()

  def scalars(directory):
    found = {}
    for file in directory.rglob('events.out.tfevents.*'):
      for event in tf.compat.v1.train.summary_iterator(str(file)):
        for value in event.summary.value:
          found[event.step, value.tag] = (
            value.metadata.SerializeToString(),
            value.tensor.dtype,
            tf.make_ndarray(value.tensor).tolist(),
          )
    return found

  ours = scalars(tmp_path / 'ours')
  assert len(ours) == 4 and ours == scalars(tmp_path / 'tf')
