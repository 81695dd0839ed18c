"""Learning-rate schedules over rounds: the closed forms, and a scheduled in-process run
against TFF's own process with the same rates set by hand before each round."""

import dataclasses
import json
import math

import numpy as np
import pytest

from tff_comp import experiment, schedules, settings
from tff_comp.run import outputs, sampling

ROUNDS, CLIENT_LR, SERVER_LR = 6, 0.05, 1.5


def test_each_schedule_follows_its_closed_form():
  exponential = schedules.Schedule('exponential', decay_rate=0.5, decay_rounds=10)
  assert [exponential.factor(t) for t in (1, 11, 21)] == [1.0, 0.5, 0.25]
  warmup = schedules.Schedule('inverse_sqrt', warmup_rounds=4)
  assert [warmup.factor(t) for t in (1, 2, 4, 16)] == [0.25, 0.5, 1.0, 0.5]
  assert schedules.Schedule().factor(1000) == 1.0
  stairs = schedules.Schedule('exponential', decay_rate=0.5, decay_rounds=10, staircase=True)
  assert [stairs.factor(t) for t in (1, 10, 11, 20, 21)] == [1.0, 1.0, 0.5, 0.5, 0.25]
  assert exponential.factor(10) == pytest.approx(0.5**0.9)  # continuous by default


def test_lr_staircase_is_a_flag_recorded_in_config_json_that_steps_the_rate(tmp_path):
  spec = next(s for s in settings.specs(schedules.ScheduleOptions) if s.flag == 'lr_staircase')
  assert (spec.type, spec.default) == (bool, False)  # binaries/flags_lib.py: --lr_staircase
  config = _config(
    tmp_path,
    client_lr_schedule='exponential',
    lr_decay_rate=0.5,
    lr_decay_rounds=2,
    lr_staircase=True,
  )
  experiment.run_experiment(experiment.prepare(config), show_progress=False)
  rows = (tmp_path / 'metrics.csv').read_text().splitlines()
  header = rows[0].split(',')
  logged = [dict(zip(header, row.split(','))) for row in rows[2:]]
  assert [float(r['hparams/client_work/learning_rate']) for r in logged] == pytest.approx(
    [CLIENT_LR * 0.5 ** ((t - 1) // 2) for t in range(1, ROUNDS + 1)], rel=1e-6
  )
  recorded = json.loads((tmp_path / 'config.json').read_text())
  assert recorded['schedules']['lr_staircase'] is True


def _client_rate(t):
  return CLIENT_LR * 0.5 ** ((t - 1) / 2)


def _server_rate(t):
  return SERVER_LR * min(t / 3, math.sqrt(3 / t))


def _config(tmp_path, **fields):
  fields = dict(dict(algorithm='fedavg', server_learning_rate=SERVER_LR), **fields)
  return experiment.ExperimentConfig.of(
    task='quadratic',
    rounds=ROUNDS,
    clients_per_round=3,
    client_learning_rate=CLIENT_LR,
    shuffle=False,
    eval_period=ROUNDS,
    output_dir=str(tmp_path),
    **fields,
  )


def test_a_scheduled_run_trains_as_tffs_process_with_the_rates_set_by_hand(tmp_path):
  config = _config(
    tmp_path,
    client_lr_schedule='exponential',
    lr_decay_rate=0.5,
    lr_decay_rounds=2,
    server_lr_schedule='inverse_sqrt',
    lr_warmup_rounds=3,
    runtime='inprocess',
  )
  prepared = experiment.prepare(config)
  experiment.run_experiment(prepared, show_progress=False)
  rows = (tmp_path / 'metrics.csv').read_text().splitlines()
  header = rows[0].split(',')
  logged = [dict(zip(header, row.split(','))) for row in rows[2:]]
  assert [float(r['hparams/client_work/learning_rate']) for r in logged] == pytest.approx(
    [_client_rate(t) for t in range(1, ROUNDS + 1)], rel=1e-6
  )
  assert [float(r['hparams/finalizer/learning_rate']) for r in logged] == pytest.approx(
    [_server_rate(t) for t in range(1, ROUNDS + 1)], rel=1e-6
  )
  recorded = json.loads((tmp_path / 'config.json').read_text())
  assert recorded['schedules']['client_lr_schedule'] == 'exponential'

  # The reference: TFF's process of the same algorithm, rates set by hand each round,
  # the same clients (the sampler is a function of seed and round).
  process = prepared.build_process()
  data = prepared.task.train_data
  sampler = sampling.ClientSampler(data.client_ids, 3, config.seed)
  state = process.initialize()
  for t in range(1, ROUNDS + 1):
    hparams = process.get_hparams(state)
    hparams['client_work']['learning_rate'] = np.float32(_client_rate(t))
    hparams['finalizer']['learning_rate'] = np.float32(_server_rate(t))
    state = process.set_hparams(state, hparams)
    ids = sampler.sample(t).reporting
    state = process.next(state, [data.create_tf_dataset_for_client(c) for c in ids]).state
  want = process.get_model_weights(state).trainable
  got = outputs.load_model(tmp_path / 'final_model.npz').trainable
  start = prepared.task.model.initial_weights[0]
  assert max(np.abs(np.asarray(w) - s).max() for w, s in zip(want, start)) > 0.05
  for a, b in zip(got, want):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
  'fields, says',
  [
    (
      dict(algorithm='qfedavg', server_learning_rate=None, server_lr_schedule='exponential'),
      'has no server learning rate to schedule',
    ),
    (dict(client_lr_schedule='exponential', lr_decay_rate=0.0), '--lr_decay_rate must be'),
    (dict(lr_warmup_rounds=0), '--lr_warmup_rounds must be >= 1'),
  ],
)
def test_a_bad_schedule_is_one_line(tmp_path, fields, says):
  with pytest.raises(experiment.ConfigError) as error:
    experiment.run_experiment(experiment.prepare(_config(tmp_path, **fields)), show_progress=False)
  assert says in str(error.value) and '\n' not in str(error.value)


def test_a_resumed_scheduled_run_scales_the_first_rates_not_the_saved_ones(tmp_path):
  """The checkpoint holds round 4's scheduled rate; a resume scales the run's first."""
  fields = dict(client_lr_schedule='exponential', lr_decay_rate=0.5, lr_decay_rounds=2)
  whole = tmp_path / 'whole'
  experiment.run_experiment(experiment.prepare(_config(whole, **fields)), show_progress=False)
  cut = tmp_path / 'cut'
  config = _config(cut, **fields)
  config = dataclasses.replace(
    config, rounds=4, checkpoints=dataclasses.replace(config.checkpoints, checkpoint_every=2)
  )
  experiment.run_experiment(experiment.prepare(config), show_progress=False)
  config = _config(cut, resume=True, **fields)
  experiment.run_experiment(experiment.prepare(config), show_progress=False)
  rates = [
    [
      float(row['hparams/client_work/learning_rate'])
      for row in outputs.whole_rows(path / 'metrics.csv')[1][1:]
    ]
    for path in (whole, cut)
  ]
  assert rates[1] == pytest.approx([_client_rate(t) for t in range(1, ROUNDS + 1)], rel=1e-6)
  assert rates[0] == rates[1]
