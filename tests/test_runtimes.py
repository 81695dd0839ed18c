"""The runtime interface: the algorithm is the unit, runtimes are registered, the
in-process engines sit behind one interface (lanes, mapped, debug)."""

import dataclasses
import json

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tests import algorithm_cases
from tff_comp import experiment, registry, settings
from tff_comp.binaries import flags_lib
from tff_comp.config import experiment_config
from tff_comp.learning_process import composer
from tff_comp.ops import algorithm as algorithm_lib
from tff_comp.ops import local_loop, sgd
from tff_comp.run import training_loop
from tff_comp.runtime import base, choice, inprocess
from tff_comp.runtime.inprocess import debug_engine

DATA, MODEL = algorithm_cases.DATA['unequal'], algorithm_cases.MODEL
IDS = list(DATA.client_ids)


def _algorithm(name='fedavg', **extra):
  return registry.get_algorithm(name).build(MODEL, **algorithm_cases.arguments(name, extra))


def _rounds(runtime, rounds=3):
  state = runtime.initialize()
  for r in range(rounds):
    state = runtime.next(state, IDS[r : r + 3]).state
  return runtime.get_model_weights(state).trainable


class _CountComputations:
  """Counts TFF computations built (tff.tensorflow.computation, federated_computation)."""

  def __init__(self, monkeypatch):
    self.count = 0
    for module, name in ((tff.tensorflow, 'computation'), (tff, 'federated_computation')):
      original = getattr(module, name)

      def counting(*args, _original=original, **kwargs):
        self.count += 1
        return _original(*args, **kwargs)

      monkeypatch.setattr(module, name, counting)


def test_an_algorithm_runs_in_process_without_building_a_tff_computation(monkeypatch):
  counter = _CountComputations(monkeypatch)
  algorithm = _algorithm('feddualavg')
  runtime, description = choice.runner_for(algorithm, DATA, 'auto')
  assert description.startswith('inprocess')
  _rounds(runtime)
  assert counter.count == 0
  composer.compose(algorithm)  # the counter sees the TFF process being built
  assert counter.count > 0


def test_both_runtimes_implement_the_interface_and_agree():
  algorithm = _algorithm('fedavg')
  fast, _ = choice.runner_for(algorithm, DATA, 'inprocess')
  slow, _ = choice.runner_for(algorithm, DATA, 'tff')
  assert isinstance(fast, base.Runtime) and isinstance(slow, base.Runtime)
  for a, b in zip(_rounds(fast), _rounds(slow)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_a_plugin_learning_process_runs_on_tff(tmp_path, monkeypatch):
  """A builder returning a plain LearningProcess (TFF's own FedAvg) trains through the
  experiment on TFF's runtime; auto says why it is not in-process."""

  def build_tff_fedavg(model, *, client_learning_rate: float):
    return tff.learning.algorithms.build_weighted_fed_avg(
      model,
      tff.learning.optimizers.build_sgdm(client_learning_rate),
      tff.learning.optimizers.build_sgdm(1.0),
    )

  monkeypatch.setitem(
    registry.ALGORITHMS._entries,
    'tff_fedavg',
    registry.Entry('tff_fedavg', build_tff_fedavg),
  )
  prepared = experiment.prepare(
    experiment.ExperimentConfig.of(
      algorithm='tff_fedavg',
      task='lasso',
      rounds=2,
      clients_per_round=2,
      eval_period=1,
      output_dir=str(tmp_path),
    )
  )
  runner = experiment.build_runner(prepared)
  assert runner.description.startswith('tff (not in-process: this process was composed')
  assert runner.algorithm is None
  metrics = experiment.train_runner(prepared, runner, show_progress=False)
  assert np.isfinite(
    metrics['eval/train_loss'] if 'eval/train_loss' in metrics else metrics['train_loss']
  )
  with pytest.raises(experiment.ConfigError, match='--runtime=inprocess'):
    choice.runner_for(prepared.build(), DATA, 'inprocess')


@dataclasses.dataclass(frozen=True)
class _EagerOptions:
  """A toy runtime's own setting."""

  eager_lanes: int = settings.setting(4, 'Clients the eager runtime holds at once.', lower=1)


def _eager_why_not(program, options: _EagerOptions) -> str:
  del options
  return '' if isinstance(program, algorithm_lib.Algorithm) else 'it runs Algorithms only'


def _build_eager(program, client_data, options: _EagerOptions, facts: base.RunFacts):
  del facts
  return inprocess.build(program, client_data, engine='debug', lanes=options.eager_lanes)


def test_a_third_runtime_is_one_registration(monkeypatch):
  """A runtime registered with its own settings, its `why_not` and its place in 'auto'
  is reachable by name and by auto, and its setting is a flag, a setting of the run
  and an entry of config.json, with no edit outside its module (here, this test)."""
  monkeypatch.setitem(
    registry.RUNTIMES._entries,
    'eager',
    registry.Entry(
      'eager', _build_eager, options=_EagerOptions, auto_rank=-1, why_not=_eager_why_not
    ),
  )
  assert 'eager' in experiment_config.runtime_names()
  runtime, _ = choice.runner_for(_algorithm('fedprox'), DATA, 'eager', eager_lanes=2)
  reference, _ = choice.runner_for(_algorithm('fedprox'), DATA, 'inprocess')
  assert runtime.record['engine'] == 'debug' and runtime.lanes == 2
  for a, b in zip(_rounds(runtime, 2), _rounds(reference, 2)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  # 'auto' tries it first (its rank is lowest); its why_not passes a process over to TFF.
  auto, _ = choice.runner_for(_algorithm('fedprox'), DATA)
  assert auto.record['engine'] == 'debug' and auto.lanes == 4
  _, description = choice.runner_for(composer.compose(_algorithm('fedprox')), DATA)
  assert 'not eager: it runs Algorithms only' in description
  # Its setting: a flag, a setting of the run, recorded in config.json and read back.
  assert 'eager_lanes' in {spec.flag for spec in flags_lib._common_specs()}
  config = experiment_config.ExperimentConfig.of(algorithm='fedprox', eager_lanes=3)
  assert config.runtime_options['eager'] == _EagerOptions(3)
  recorded = json.loads(json.dumps(dataclasses.asdict(config)))
  assert recorded['runtime_options']['eager'] == {'eager_lanes': 3}
  assert (
    experiment_config.ExperimentConfig.from_dict(recorded).runtime_options['eager'].eager_lanes == 3
  )
  with pytest.raises(settings.ConfigError, match='eager_lanes'):
    experiment_config.ExperimentConfig.of(algorithm='fedprox', eager_lanes=0)
  with pytest.raises(settings.ConfigError, match='--eager_lanes: a setting of the eager runtime'):
    experiment_config.ExperimentConfig.of(
      algorithm='fedprox', runtime='inprocess', eager_lanes=3
    ).check()


class _FailsOnNaN(sgd.SGD):
  """Local SGD that checks its batch loss is a number."""

  def local_step(self, weights, extras, batch, hparams, payload, context):
    loss, weights, extras = super().local_step(weights, extras, batch, hparams, payload, context)
    return tf.debugging.check_numerics(loss, 'batch loss'), weights, extras


def test_the_debug_engine_names_the_failing_client_and_stage(tmp_path, monkeypatch):
  monkeypatch.setenv('TFF_COMP_DATA_DIR', str(tmp_path))
  from tff_comp.tasks import array_data

  def make(i):
    x = np.ones((7, algorithm_cases.D), np.float32)
    if i == 1:
      x[4] = np.nan  # client 'c1': its second batch of 3 holds a NaN
    return x, np.ones(7, np.float32)

  data = array_data.cached_client_data(
    'debug-nan', ['c0', 'c1'], (algorithm_cases.D,), tf.float32, make
  )
  algorithm = _algorithm('fedavg')
  algorithm = type(algorithm)(
    algorithm.model,
    _FailsOnNaN(algorithm.model, learning_rate=0.02),
    algorithm.server_rule,
    algorithm.client_options,
  ).with_client_options(shuffle=False)
  runtime = inprocess.build(algorithm, data, engine='debug')
  with pytest.raises(
    debug_engine.ClientError, match=r"client 'c1' \(index 1\) failed in local step 1 of _FailsOnNaN"
  ):
    runtime.next(runtime.initialize(), ['c0', 'c1'])


class _NotVectorizable(sgd.SGD):
  """Local SGD whose reported loss passes through a Python function (no XLA kernel, no
  vectorization rule)."""

  def local_step(self, weights, extras, batch, hparams, payload, context):
    loss, weights, extras = super().local_step(weights, extras, batch, hparams, payload, context)
    loss = tf.py_function(lambda value: value, [loss], tf.float32)
    return tf.ensure_shape(loss, []), weights, extras


def test_auto_falls_back_to_mapped_naming_the_op_and_the_rule(tmp_path, caplog):
  algorithm = _algorithm('fedavg')
  algorithm = type(algorithm)(
    algorithm.model,
    _NotVectorizable(algorithm.model, learning_rate=0.02),
    algorithm.server_rule,
    algorithm.client_options,
  )
  auto = inprocess.build(algorithm, DATA)
  assert auto.record['engine'] == 'lanes'
  with caplog.at_level('WARNING'):
    weights = _rounds(auto)
  assert auto.record['engine'] == 'mapped'
  lines = [r.getMessage() for r in caplog.records if 'clients run mapped' in r.getMessage()]
  assert len(lines) == 1 and '\n' not in lines[0]
  # A run records the engine actually used, not the one it started with.
  training_loop.run_simulation(
    inprocess.build(algorithm, DATA),
    client_ids=IDS,
    rounds=2,
    clients_per_round=3,
    seed=0,
    output_dir=tmp_path,
    config={'resolved': {}},
    show_progress=False,
    callbacks=training_loop.standard_callbacks(
      lambda _: {'x': 0.0}, eval_period=1, show_progress=False
    ),
  )
  recorded = json.loads((tmp_path / 'config.json').read_text())
  assert recorded['runtime_record']['engine'] == 'mapped'
  assert recorded['resolved']['runtime'].startswith('inprocess on')
  assert 'mapped engine (lanes cannot run _NotVectorizable' in recorded['resolved']['runtime']
  assert 'EagerPyFunc' in auto.why and '_NotVectorizable' in auto.why
  for a, b in zip(weights, _rounds(inprocess.build(algorithm, DATA, engine='mapped'))):
    np.testing.assert_allclose(a, b, rtol=1e-6)


@pytest.mark.parametrize('shuffle', [True, False])
def test_a_run_shuffles_local_data_by_default_and_records_it(tmp_path, shuffle):
  config = experiment.ExperimentConfig.of(
    algorithm='fedavg',
    task='lasso',
    rounds=1,
    eval_period=1,
    seed=4,
    output_dir=str(tmp_path),
    **({} if shuffle else {'shuffle': False}),
  )
  prepared = experiment.prepare(config)
  runner = experiment.build_runner(prepared)
  options = runner.algorithm.client_options
  assert (options.shuffle, options.seed) == (shuffle, 4)
  experiment.train_runner(prepared, runner, show_progress=False)
  assert json.loads((tmp_path / 'config.json').read_text())['local_work']['shuffle'] is shuffle


def test_a_client_data_built_in_python_is_refused_on_tff_in_one_line():
  """A dataset function looking its client up in a Python dict runs in-process, and on
  TFF's runtime (which traces it with a client id tensor) is one line naming the cause
  and the runtime that runs it (it was a bare `KeyError: <tf.Tensor 'arg:0'>`)."""
  arrays = {
    c: tuple(
      np.asarray(t)
      for t in local_loop.materialize(
        algorithm_cases.DATA['unequal'].create_tf_dataset_for_client(c)
      )
    )
    for c in algorithm_cases.DATA['unequal'].client_ids
  }
  data = tff.simulation.datasets.ClientData.from_clients_and_tf_fn(
    list(arrays), lambda cid: tf.data.Dataset.from_tensor_slices(arrays[cid])
  )
  algorithm = algorithm_cases.algorithm('fedavg', {})
  runtime, _ = choice.runner_for(algorithm, data, 'inprocess')
  runtime.next(runtime.initialize(), list(arrays)[:2])
  with pytest.raises(settings.ConfigError) as error:
    choice.runner_for(algorithm, data, 'tff')
  message = str(error.value)
  assert '\n' not in message and 'KeyError' in message
  assert message.endswith('run it with --runtime=inprocess, which reads it in Python')
