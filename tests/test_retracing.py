"""No `tf.function` traces again, and XLA compiles nothing again, after a run's second
round, in any configuration: a retrace costs a round's time many times over (shuffled
streaming retraced every round; a resumed run traced its round again)."""

import collections
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.eager.polymorphic_function import tracing_compilation
import tensorflow_federated as tff

from tff_comp import experiment, keras_models, registry
from tff_comp.run import sampling, training_loop
from tff_comp.runtime import choice

ROUNDS = 20


@pytest.fixture
def traces(monkeypatch):
  """The names of the `tf.function`s traced while the test runs, in order."""
  traced = []
  create = tracing_compilation._create_concrete_function

  def counting(function_type, type_context, func_graph, tracing_options):
    traced.append(tracing_options.name)
    return create(function_type, type_context, func_graph, tracing_options)

  monkeypatch.setattr(tracing_compilation, '_create_concrete_function', counting)
  return traced


class _Watched:
  """The runtime, noting how many traces there were when round 3 starts."""

  def __init__(self, runtime, traced: list[str]):
    self._runtime, self._traced, self.rounds, self.before_round_3 = runtime, traced, 0, None

  def __getattr__(self, name):
    return getattr(self._runtime, name)

  def next(self, state, ids, work=None):
    self.rounds += 1
    if self.rounds == 3:
      self.before_round_3 = len(self._traced)
    return self._runtime.next(state, ids, work)


def _train(traces, tmp_path, **settings) -> list[str]:
  """Trains a run of `settings` (quadratic task, 3 of 6 clients a round, evaluated every
  5 rounds); returns the traces made from its third round on."""
  config = dict(
    algorithm='fedavg',
    task='quadratic',
    rounds=ROUNDS,
    clients_per_round=3,
    eval_period=5,
    checkpoint_every=5,
    output_dir=str(tmp_path),
    seed=4,
  )
  prepared = experiment.prepare(experiment.ExperimentConfig.of(**{**config, **settings}))
  runner = experiment.build_runner(prepared)
  watched = runner.runtime = _Watched(runner.runtime, traces)
  experiment.train_runner(prepared, runner, show_progress=False)
  assert watched.rounds >= 3, watched.rounds
  return traces[watched.before_round_3 :]


SETTINGS = {
  'lanes-shuffled': dict(engine='lanes'),
  'lanes-stored-order': dict(engine='lanes', shuffle=False),
  'mapped-shuffled': dict(engine='mapped'),
  'mapped-stored-order': dict(engine='mapped', shuffle=False),
  'streaming-shuffled': dict(data_memory_budget=0.0),
  'streaming-poisson-dropout': dict(data_memory_budget=0.0, sampling='poisson', dropout_rate=0.3),
  'poisson-dropout-stragglers': dict(
    engine='lanes', sampling='poisson', dropout_rate=0.3, straggler_rate=0.3
  ),
  'dp': dict(engine='lanes', aggregator='dp', clip_norm=1.0, noise_multiplier=0.3),
  'dp-adaptive': dict(
    engine='mapped',
    aggregator='dp_adaptive',
    clip_norm=1.0,
    noise_multiplier=0.3,
    clipped_count_stddev=1.0,
  ),
  # Trees of 2 rounds (a cyclic epoch of 3 of the 6 clients), restarting in the run.
  'dp-ftrl-tree': dict(
    engine='lanes',
    aggregator='dp_ftrl_tree',
    clip_norm=1.0,
    noise_multiplier=0.3,
    sampling='cyclic',
  ),
  # Three bands (a cyclic epoch of 3 of the 6 clients): two noise vectors kept.
  'dp-bandmf': dict(
    engine='lanes',
    aggregator='dp_bandmf',
    clip_norm=1.0,
    noise_multiplier=0.3,
    sampling='cyclic',
  ),
  'schedules': dict(
    engine='lanes',
    client_lr_schedule='exponential',
    server_lr_schedule='inverse_sqrt',
    lr_decay_rounds=3,
  ),
  'server-adam': dict(engine='mapped', server_optimizer='adam'),
  # Every combiner and compressor of the aggregator blocks, with attackers.
  'median-rotated-quantized-alie': dict(
    engine='lanes',
    aggregator='median',
    compression='quantize',
    quantize_bits=4,
    hadamard_rotation=True,
    attack='alie',
    attack_fraction=0.3,
  ),
  'trimmed-mean-qsgd': dict(
    engine='mapped', aggregator='trimmed_mean', trim_fraction=0.4, compression='qsgd'
  ),
  'krum-rand-k-sign-flip': dict(
    engine='lanes', aggregator='krum', byzantine_clients=0, compression='rand_k', attack='sign_flip'
  ),
  'multi-krum-sign': dict(
    engine='mapped', aggregator='multi_krum', byzantine_clients=0, compression='sign'
  ),
  'geometric-median-top-k-ef21': dict(
    engine='lanes',
    aggregator='geometric_median',
    compression='top_k',
    sparsity_fraction=0.5,
    error_feedback='ef21',
  ),
  'centered-clip-gaussian': dict(engine='mapped', aggregator='centered_clip', attack='gaussian'),
  'secure-sum-ef-majority': dict(
    engine='lanes', compression='top_k', error_feedback='ef', secure_aggregation=True
  ),
  'sign-majority-vote': dict(engine='mapped', compression='sign'),
  'feddualavg': dict(algorithm='feddualavg', engine='lanes'),
  'scaffold-streaming': dict(algorithm='scaffold', data_memory_budget=0.0),
  # Cohorts of every size the deadline leaves, some clients doing part of their steps.
  'device-deadline': dict(
    engine='lanes',
    device_model='lognormal',
    round_deadline=1.0,
    deadline_policy='partial',
    overselect=1.5,
  ),
}


@pytest.mark.parametrize('name', SETTINGS)
def test_no_retrace_after_the_second_round(traces, tmp_path, name):
  assert _train(traces, tmp_path, **SETTINGS[name]) == []


@pytest.mark.parametrize('engine', ['lanes', pytest.param('mapped', marks=pytest.mark.slow)])
def test_a_resumed_run_traces_what_a_fresh_run_traces(traces, tmp_path, engine):
  """A resumed run traces its functions as often as a fresh run does, from its first
  round on (a restored state of other dtypes than the rounds return traced the round
  once more in the resumed run's second round). A first run warms what a process traces
  once for every build (`resident_data._client_keys`), so that the order tests run in
  does not matter."""
  _train(traces, tmp_path / 'warm', engine=engine, rounds=3)
  del traces[:]
  _train(traces, tmp_path / 'fresh', engine=engine, rounds=10)
  fresh = collections.Counter(traces)
  _train(traces, tmp_path / 'resumed', engine=engine, rounds=6)
  del traces[:]
  assert _train(traces, tmp_path / 'resumed', engine=engine, rounds=10, resume=True) == []
  assert collections.Counter(traces) == fresh


def test_no_retrace_with_a_keras_model(traces, tmp_path):
  tf.keras.utils.set_random_seed(0)
  keras = tf.keras.Sequential(
    [
      tf.keras.layers.InputLayer((6,)),
      tf.keras.layers.Dense(4, activation='relu'),
      tf.keras.layers.Dense(3),
    ]
  )
  spec = (tf.TensorSpec([None, 6], tf.float32), tf.TensorSpec([None], tf.int32))
  model = keras_models.from_keras(
    keras, tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True), spec
  )
  rng = np.random.default_rng(0)
  data = tff.simulation.datasets.TestClientData(
    {
      f'c{i}': (
        rng.normal(size=(5 + i, 6)).astype(np.float32),
        rng.integers(0, 3, 5 + i).astype(np.int32),
      )
      for i in range(6)
    }
  )
  algorithm = registry.get_algorithm('fedavg').build(model, client_learning_rate=0.1, batch_size=2)
  for engine in ('lanes', 'mapped'):
    runtime, _ = choice.runner_for(algorithm, data, 'inprocess', engine=engine)
    watched = _Watched(runtime, traces)
    training_loop.run_simulation(
      watched,
      client_ids=list(data.client_ids),
      rounds=ROUNDS,
      clients_per_round=3,
      seed=1,
      output_dir=tmp_path / engine,
      config={},
      callbacks=training_loop.standard_callbacks(lambda _: {}, eval_period=5, show_progress=False),
      show_progress=False,
      participation=sampling.Participation('poisson', dropout_rate=0.2),
    )
    assert traces[watched.before_round_3 :] == [], engine


# Runs in a fresh Python with XLA's compile log: a lanes run with cohorts of changing
# sizes (Poisson sampling, dropout), shuffled, then resumed; argv[2] more settings.
_XLA_RUN = """
import ast, sys
from tff_comp import experiment
for rounds, resume in ((12, False), (24, True)):
  prepared = experiment.prepare(experiment.ExperimentConfig.of(
      algorithm='fedavg', task='quadratic', rounds=rounds, clients_per_round=3,
      sampling='poisson', dropout_rate=0.3, engine='lanes', eval_period=5,
      checkpoint_every=6, output_dir=sys.argv[1], resume=resume,
      **ast.literal_eval(sys.argv[2])))
  experiment.train_runner(prepared, experiment.build_runner(prepared), show_progress=False)
  print('run done', file=sys.stderr, flush=True)
"""


def test_xla_compiles_each_program_once_per_process(tmp_path):
  # The clients' kernel, and the chain's encodes (`stages.RoundStages._encode`): the
  # cohort's rows padded to the round's capacity.
  settings = dict(compression='quantize', hadamard_rotation=True)
  programs = ['encode_rows', 'local_steps']
  out = subprocess.run(
    [sys.executable, '-c', _XLA_RUN, str(tmp_path), repr(settings)],
    capture_output=True,
    text=True,
    timeout=600,
    stdin=subprocess.DEVNULL,
    env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='0', TF_CPP_VMODULE='device_compilation_profiler=1'),
  )
  assert out.returncode == 0, out.stderr[-3000:]
  runs = out.stderr.split('run done')[:2]
  assert len(runs) == 2, out.stderr[-3000:]
  for run in runs:  # the fresh run, then the resumed one: each program compiled once
    compiles = re.findall(r'Compiled (\S+) (\d+) times', run)
    named = sorted(next((p for p in programs if p in name), name) for name, _ in compiles)
    assert named == programs, compiles
