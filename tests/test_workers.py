"""Scale-out on TFF's own workers (`runtime.workers`): rounds split across two workers
equal one worker's, multi-stage rounds and dead or missing workers are one-line errors."""

import numpy as np
import pytest
import tensorflow_federated as tff

from tests import algorithm_cases
from tff_comp import experiment, runtime
from tff_comp.runtime import tff_process, workers

DATA = algorithm_cases.DATA['unequal']


def _train(name: str, rounds: int = 2):
  process = algorithm_cases.build(name, {})
  composed = tff.simulation.compose_dataset_computation_with_learning_process(
    tff_process.dataset_computation_for(process, DATA), process
  )
  state = composed.initialize()
  for _ in range(rounds):
    state = composed.next(state, list(DATA.client_ids[:4])).state
  return process.get_model_weights(state).trainable


@pytest.fixture
def two_workers():
  """Two local workers as TFF's context; the local runtime comes back afterwards."""
  addresses, processes = workers.start_local_workers(2)
  try:
    workers.install_remote_runtime(addresses, deadline_seconds=30)
    yield addresses, processes
  finally:
    for process in processes:
      process.kill()
      process.wait()
    runtime.install_local_runtime()


def test_two_workers_give_one_workers_results(two_workers):
  del two_workers
  names = ('fedavg', 'feddualavg', 'fednova')
  split = {name: _train(name) for name in names}
  runtime.install_local_runtime()
  for name in names:
    for a, b in zip(split[name], _train(name)):
      np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_a_round_with_two_aggregation_stages_is_refused():
  with pytest.raises(workers.NotMergeableError, match='more than one aggregation stage'):
    workers.check_mergeable(
      tff.simulation.compose_dataset_computation_with_learning_process(
        tff_process.dataset_computation_for(algorithm_cases.build('comfedl', {}), DATA),
        algorithm_cases.build('comfedl', {}),
      )
    )


def test_a_dead_worker_fails_the_round_naming_it(two_workers):
  addresses, processes = two_workers
  workers.install_remote_runtime(addresses, deadline_seconds=2)
  _train('fedavg', rounds=1)
  processes[1].kill()
  processes[1].wait()
  with pytest.raises(workers.WorkerError, match=addresses[1]):
    _train('fedavg', rounds=1)


def test_a_worker_that_never_answers_is_named():
  addresses, processes = workers.start_local_workers(1)
  processes[0].kill()
  processes[0].wait()
  try:
    with pytest.raises(workers.WorkerError, match=addresses[0]):
      workers.install_remote_runtime(addresses, deadline_seconds=1)
  finally:
    runtime.install_local_runtime()


@pytest.mark.parametrize('spec', ['', 'localhost', 'host:0', 'host:port', ':80', 'a:1,a:1'])
def test_malformed_addresses_are_refused(spec):
  with pytest.raises(ValueError):
    workers.parse_addresses(spec)


def test_addresses_parse():
  assert workers.parse_addresses(' 10.0.0.2:8000, [::1]:9000 ') == ['10.0.0.2:8000', '[::1]:9000']


def test_workers_do_not_go_with_the_in_process_runtime():
  with pytest.raises(experiment.ConfigError, match='--workers'):
    experiment.prepare(
      experiment.ExperimentConfig.of(
        algorithm='fedavg', runtime='inprocess', workers=('localhost:1',)
      )
    )
  with pytest.raises(experiment.ConfigError, match=r'--engine \(inprocess\) and --workers'):
    experiment.prepare(
      experiment.ExperimentConfig.of(algorithm='fedavg', engine='lanes', workers=('localhost:1',))
    )
  with pytest.raises(experiment.ConfigError, match='--engine: a setting of the inprocess'):
    experiment.prepare(
      experiment.ExperimentConfig.of(algorithm='fedavg', runtime='tff', engine='lanes')
    )
