"""An algorithm's and a task's options as typed records (`config.builder_options`): typed
and checked when the config is made, a frozen mapping of the options given (pickled:
test_settings)."""

import dataclasses

import pytest

from tff_comp import experiment, registry
from tff_comp.config import builder_options


def _config(**values):
  return experiment.ExperimentConfig.of(algorithm='fedprox', task='quadratic', **values)


def test_options_are_the_builders_typed_record():
  config = _config(algorithm_options={'mu': 1}, task_options={'dim': 3})
  options = config.algorithm_options
  assert repr(options) == 'FedproxAlgorithmOptions(mu=1.0)'
  assert options.mu == 1.0 and type(options.mu) is float
  assert options.local_steps is None  # not given: the builder's default applies
  assert dict(options) == {'mu': 1.0}
  assert config.task_options.dim == 3 and dict(config.task_options) == {'dim': 3}
  with pytest.raises(AttributeError):
    options.dim  # noqa: B018 (the task's option, not the algorithm's)
  # Its options are the builder's keyword-only parameters, the common settings aside.
  signature = {h.name for h in registry.get_algorithm('fedprox').hparams}
  assert builder_options.names('algorithm', 'fedprox') == signature - set(
    builder_options.COMMON_ALGORITHM_ARGS
  )
  assert 'seed' not in builder_options.names('task', 'quadratic')


def test_a_record_made_directly_is_the_configs_own():
  record = builder_options.record_type('algorithm', 'fedprox')(mu=0.5)
  config = _config(algorithm_options=record)
  assert config.algorithm_options is record and record.mu == 0.5
  with pytest.raises(experiment.ConfigError, match="--mu takes a number, got 'x'"):
    builder_options.record_type('algorithm', 'fedprox')(mu='x')


def test_none_is_not_given():
  assert dict(_config(algorithm_options={'mu': None}).algorithm_options) == {}


def test_a_task_seed_option_is_refused_as_the_data_seed_sets_it():
  with pytest.raises(
    experiment.ConfigError, match="--quadratic_seed does not apply to task 'quadratic'"
  ):
    _config(task_options={'seed': 3})


def test_changing_the_algorithm_or_task_checks_the_options_again():
  config = _config(algorithm_options={'mu': 0.5})
  with pytest.raises(experiment.ConfigError, match="--mu does not apply to algorithm 'fedavg'"):
    dataclasses.replace(config, algorithm='fedavg')
  assert dict(dataclasses.replace(config, task='lasso').algorithm_options) == {'mu': 0.5}
  with pytest.raises(experiment.ConfigError, match="--lasso_dim does not apply to task 'lasso'"):
    dataclasses.replace(_config(task_options={'dim': 3}), task='lasso')


def test_an_option_named_as_a_mapping_method_is_refused():
  table = registry.Registry('algorithm', 'tff_comp.test_no_plugins')
  table._plugins_loaded = True

  def build(*, items: float = 1.0):
    del items

  table.add('clash', build)
  kinds = dict(builder_options.KINDS, algorithm=builder_options.Kind(table, (), False))
  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(builder_options, 'KINDS', kinds)
    with pytest.raises(registry.RegistryError, match="option 'items' is a name"):
      builder_options.record_type('algorithm', 'clash')
