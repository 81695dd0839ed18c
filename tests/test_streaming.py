"""Streaming client data (`runtime.inprocess.streaming`): a population over the memory budget
trains with only each cohort on the device, with the resident copy's results."""

import numpy as np
import pytest
import tensorflow as tf

from tests import algorithm_cases
from tff_comp import data as data_lib
from tff_comp import experiment, registry
from tff_comp.run import callbacks, checkpoints, sampling, training_loop
from tff_comp.runtime import inprocess
from tff_comp.runtime.inprocess import streaming
from tff_comp.tasks import generated

DATA = algorithm_cases.TEN


def _algorithm(name):
  # Per-client tables (SCAFFOLD's controls, Ditto's personal models, AFL's weights) sized
  # for all ten clients.
  extra = (
    {'num_clients': len(DATA.client_ids)}
    if registry.get_algorithm(name).accepts('num_clients')
    else {}
  )
  return (
    registry.get_algorithm(name)
    .build(algorithm_cases.MODEL, **algorithm_cases.arguments(name, extra))
    .with_client_options(shuffle=True, seed=5)
  )


def test_the_estimate_is_the_resident_copys_size():
  arrays = data_lib.client_arrays(DATA)
  exact = sum(a.nbytes for a in tf.nest.flatten(arrays.examples))
  assert streaming.estimate_bytes(DATA, sample=len(DATA.client_ids)) == pytest.approx(
    exact, rel=1e-6
  )
  assert streaming.estimate_bytes(DATA, sample=4) == pytest.approx(exact, rel=0.5)


# By default FedAvg's path and per-client server state (SCAFFOLD's c_i; Ditto's personal
# models are rows alike); every algorithm in the slow suite.
@pytest.mark.parametrize('name', algorithm_cases.each_algorithm(keep=('fedavg', 'scaffold')))
def test_a_population_over_the_budget_streams_with_the_resident_results(tmp_path, name):
  """Every algorithm, those with per-client server state included: a client's row of
  that state is its index in the population, not its position in the loaded cohort."""
  resident = inprocess.build(_algorithm(name), DATA, data_memory_budget=1e6)
  streamed = inprocess.build(_algorithm(name), DATA, data_memory_budget=0.0)
  assert resident.record['data'] == 'resident' and streamed.record['data'] == 'streaming'
  assert 'exceed --data_memory_budget=0 MB' in streamed.description
  finals, loaded, reads, prefetched, unprefetched = [], [], [], set(), []
  read, prefetch, load = streamed.data._read, streamed.data.prefetch, streamed.data.load
  streamed.data._read = lambda ids: reads.append(ids) or read(ids)
  streamed.data.prefetch = lambda ids: prefetched.add(frozenset(ids)) or prefetch(ids)

  def watched_load(ids):
    if frozenset(ids) not in prefetched:
      unprefetched.append(ids)
    load(ids)

  streamed.data.load = watched_load

  class Watch(callbacks.Callback):
    def after_round(self, loop, round_num, metrics):
      if loop.runtime.streaming:
        loaded.append(len(loop.runtime.data.index))

  # Seed 4 draws a partial cohort (some sampled clients not reporting) in rounds 2, 4
  # and 6 too, so a prefetch of the sampled instead of the reporting clients shows.
  sampler = sampling.ClientSampler(
    DATA.client_ids, 3, 4, sampling.Participation('poisson', dropout_rate=0.2)
  )
  assert sum(0 < len(d.reporting) < len(d.sampled) for d in map(sampler.sample, range(2, 7))) >= 2
  for runtime in (resident, streamed):
    training_loop.run_simulation(
      runtime,
      client_ids=list(DATA.client_ids),
      rounds=6,
      clients_per_round=3,
      seed=4,
      output_dir=tmp_path / runtime.record['data'],
      config={},
      show_progress=False,
      callbacks=[Watch()],
      participation=sampling.Participation('poisson', dropout_rate=0.2),
    )
    # The whole server state: per-client rows too, not only the model.
    finals.append(
      checkpoints.Checkpoints(tmp_path / runtime.record['data']).load_latest(runtime.initialize())[
        0
      ]
    )
  for a, b in zip(*map(tf.nest.flatten, finals), strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  finals = [resident.get_model_weights(state).trainable for state in finals]
  assert (
    max(np.abs(f - i).max() for f, i in zip(finals[0], algorithm_cases.MODEL.initial_weights[0]))
    > 1e-3
  )
  assert loaded and max(loaded) <= 8 < len(DATA.client_ids)  # only cohorts were loaded
  assert len(reads) <= 6  # each round's cohort read once (a prefetch is not wasted)
  assert not unprefetched  # round 1's too, while round 0 is scored


def test_a_run_over_its_budget_says_it_streams_and_records_it(tmp_path):
  prepared = experiment.prepare(
    experiment.ExperimentConfig.of(
      algorithm='fedavg',
      task='quadratic',
      rounds=3,
      clients_per_round=2,
      data_memory_budget=0.0,
      output_dir=str(tmp_path),
    )
  )
  runner = experiment.build_runner(prepared)
  assert 'streaming each cohort' in runner.description
  experiment.train_runner(prepared, runner, show_progress=False)
  assert '"data": "streaming"' in (tmp_path / 'config.json').read_text()
  with pytest.raises(experiment.ConfigError, match='data_memory_budget must be >= 0'):
    experiment.prepare(
      experiment.ExperimentConfig.of(
        algorithm='fedavg',
        task='quadratic',
        data_memory_budget=-1.0,
        output_dir=str(tmp_path / 'b'),
      )
    )


def test_an_engine_compiling_for_the_data_shape_is_refused_on_streamed_data():
  with pytest.raises(inprocess.UnsupportedError, match='lanes engine needs resident data'):
    inprocess.build(_algorithm('fedavg'), DATA, engine='lanes', data_memory_budget=0)
  streamed = inprocess.build(_algorithm('fedavg'), DATA, data_memory_budget=0)
  assert streamed.record['engine'] == 'mapped' and 'streaming' in streamed.why


def test_a_short_run_on_a_large_population_reads_only_its_cohorts():
  """2 rounds of synthetic EMNIST read all 3,400 writers before round 1 (minutes)."""
  sizes = np.full(inprocess.STREAM_SHORT_RUNS_FROM, 3, np.int32)
  reads = []

  def make(n, key):
    reads.append(1)  # traced once per client read (a dataset built per client)
    return (
      tf.random.stateless_normal([n, 5], key),
      tf.cast(tf.random.stateless_uniform([n], key, 0, 2, tf.int32), tf.float32),
    )

  population = generated.client_data('c', sizes, 0, make)
  budget = inprocess.InProcessOptions.data_memory_budget
  algorithm = _algorithm('fedavg')
  short = inprocess.build(algorithm, population, client_rounds=10, data_memory_budget=budget)
  assert 'streaming' in short.why and short.record['data'] == 'streaming'
  assert len(reads) < 100  # the size estimate's sample and the first client, not all
  # A run training every client at least once on average loads them all.
  resident = inprocess.build(algorithm, population, client_rounds=1000, data_memory_budget=budget)
  assert 'streaming' not in resident.why
