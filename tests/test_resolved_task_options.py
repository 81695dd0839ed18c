"""What a task resolved of its options is recorded (config.json's
`resolved.task_options`: EMNIST's model='auto' as the model that ran), and a resume
that names the same model explicitly is the same run, another model is not."""

import json

import pytest

from tff_comp import experiment

TASK = dict(source='synthetic', max_clients=12)


def _train(path, resume=False, rounds=1, **task_options):
  config = experiment.ExperimentConfig.of(
    algorithm='fedavg',
    task='emnist',
    task_options=dict(TASK, **task_options),
    rounds=rounds,
    clients_per_round=4,
    eval_period=1,
    checkpoint_every=1,
    output_dir=str(path),
    resume=resume,
  )
  experiment.train(config, show_progress=False)
  return json.loads((path / 'config.json').read_text())


def test_auto_is_recorded_as_the_model_that_ran_and_resumes_under_its_name(tmp_path):
  recorded = _train(tmp_path)
  assert recorded['task_options'] == TASK  # as given: 'auto' left to the task
  assert recorded['resolved']['task_options']['model'] == 'softmax'
  with pytest.raises(
    experiment.ConfigError, match=r"task_options\.model: recorded 'softmax', now 'cnn'"
  ):
    _train(tmp_path, resume=True, rounds=2, model='cnn')
  resumed = _train(tmp_path, resume=True, rounds=2, model='softmax')
  assert resumed['resolved']['task_options']['model'] == 'softmax'
