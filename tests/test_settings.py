"""Settings records typed as their fields declare (`settings.check`): a value of another
type from the Python API is one line naming its flag, before anything is built (flags
are typed by absl); a frozen config's option mappings cannot change."""

import dataclasses
import json
import pickle
import re

import numpy as np
import pytest

from tff_comp import experiment
from tff_comp.config import builder_options


@pytest.mark.parametrize(
  'given, says',
  [
    (dict(rounds='10'), "--rounds takes an integer, got '10'."),
    (dict(rounds=2.5), '--rounds takes an integer, got 2.5.'),
    (dict(seed=None), '--seed takes an integer, got None.'),
    (dict(server_learning_rate='x'), "--server_learning_rate takes a number, got 'x'."),
    (dict(batch_size=True), '--batch_size takes an integer, got True.'),
    (dict(sampling=3), '--sampling takes a string, got 3.'),
    (dict(aggregator='clip', clip_norm='1'), "--clip_norm takes a number, got '1'."),
    (dict(checkpoint_every='2'), "--checkpoint_every takes an integer, got '2'."),
    (dict(workers='localhost:8000'), "--workers takes a sequence, got 'localhost:8000'."),
    (dict(workers=('localhost:8000', 8001)), '--workers takes a string, got 8001.'),
  ],
)
def test_a_value_of_another_type_is_one_line_naming_its_flag(given, says):
  with pytest.raises(experiment.ConfigError, match=f'^{re.escape(says)}$'):
    experiment.ExperimentConfig.of(algorithm='fedavg', **given).check()


def test_values_of_the_declared_types_pass_and_numpy_scalars_become_pythons():
  config = experiment.ExperimentConfig.of(
    algorithm='fedavg',
    rounds=np.int64(3),
    data_seed=None,  # the field admits None: the run's seed
    server_learning_rate=1,  # an integer for a number
    aggregator='clip',
    clip_norm=np.float32(0.5),
    workers=['localhost:8000'],  # config.json's list for the tuple
  )
  config.check()
  assert type(config.rounds) is int and config.rounds == 3
  assert type(config.privacy.clip_norm) is float and config.privacy.clip_norm == 0.5


def test_a_configs_options_cannot_change_and_record_and_pickle_as_mappings():
  """The builders' options records (`config.builder_options`) pickle by the builder's
  name and the options given: their classes are made at run time, so pickle cannot find
  them by reference (a config sent to another process, copied, deep-copied)."""
  config = experiment.ExperimentConfig.of(algorithm='fedprox', algorithm_options=dict(mu=0.1))
  with pytest.raises(TypeError, match='options cannot change'):
    config.algorithm_options['mu'] = 1.0
  with pytest.raises(TypeError, match='options cannot change'):
    config.task_options.update(dim=3)
  with pytest.raises(AttributeError, match='options cannot change'):
    config.algorithm_options.mu = 1.0  # type: ignore[misc]
  with pytest.raises(TypeError, match='options cannot change'):
    del config.runtime_options['tff']
  recorded = json.loads(json.dumps(dataclasses.asdict(config), default=str))
  assert recorded['algorithm_options'] == {'mu': 0.1}
  assert experiment.ExperimentConfig.from_dict(recorded) == config
  again = pickle.loads(pickle.dumps(config))
  assert again == config and type(again.algorithm_options) is type(config.algorithm_options)
  changed = dataclasses.replace(config, algorithm_options={'mu': 0.2})
  assert isinstance(changed.algorithm_options, builder_options.BuilderOptions)
  assert changed.algorithm_options == {'mu': 0.2} and config.algorithm_options == {'mu': 0.1}
