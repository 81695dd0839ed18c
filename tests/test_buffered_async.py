"""Buffered asynchronous aggregation (FedBuff): against synchronous FedAvg where they
coincide, and against an independent NumPy event simulation on the quadratic task."""

import re

import numpy as np
import pytest

from tff_comp import experiment
from tff_comp.run import callbacks as callbacks_lib
from tff_comp.run import devices as devices_lib
from tff_comp.run import sampling
from tff_comp.runtime.inprocess import streaming
from tff_comp.runtime.ray import cluster as ray_cluster


class _Final(callbacks_lib.Callback):
  """Keeps the run's final model weights and its rows."""

  def __init__(self):
    self.rows = []

  def after_round(self, loop, round_num, metrics):
    self.rows.append(dict(metrics))

  def on_train_end(self, loop, completed):
    self.weights = [np.asarray(w) for w in loop.runtime.get_model_weights(loop.state).trainable]


def _run(tmp_path, name, **settings):
  settings = dict(dict(algorithm='fedavg', task='quadratic'), **settings)
  prepared = experiment.prepare(
    experiment.ExperimentConfig.of(eval_period=1000, output_dir=str(tmp_path / name), **settings)
  )
  final = _Final()
  experiment.run_experiment(prepared, show_progress=False, callbacks=[final])
  return prepared, final


# A chain with state (the rotation's seed, advanced each step) and draws (4-bit
# stochastic rounding, seeded by step and client).
ROTATE_QUANTIZE = dict(compression='quantize', quantize_bits=4, hadamard_rotation=True)


@pytest.mark.parametrize(
  'algorithm,chain',
  [  # a dual state and a chain in the buffer: make test-slow (a chain's: the resume below)
    ('fedavg', {}),
    pytest.param('feddualavg', {}, marks=pytest.mark.slow),
    pytest.param('fedavg', ROTATE_QUANTIZE, marks=pytest.mark.slow),
  ],
)
def test_with_concurrency_equal_to_the_buffer_and_equal_times_it_is_synchronous(
  tmp_path, algorithm, chain
):
  # LASSO with shuffling: each client's batches depend on its start version's round.
  common = dict(algorithm=algorithm, task='lasso', rounds=5, shuffle=True, seed=2, **chain)
  _, sync = _run(tmp_path, 'sync', clients_per_round=3, **common)
  _, buffered = _run(
    tmp_path, 'async', mode='async', concurrency=3, buffer_size=3, staleness='poly', **common
  )
  np.testing.assert_allclose(buffered.weights[0], sync.weights[0], rtol=1e-6, atol=1e-7)
  assert all(r['train/async/staleness_max'] == 0 for r in buffered.rows)
  assert [r['time/simulated_seconds'] for r in buffered.rows] == list(range(1, 6))
  assert not np.allclose(sync.weights[0], 0)


def _reference(
  centers,
  counts,
  seconds,
  draw,
  *,
  concurrency,
  buffer_size,
  steps,
  eta,
  eta_s,
  staleness,
  max_staleness,
  client_weights,
  combine=lambda w, rows: w @ rows / w.sum(),
):
  """FedBuff on F_i(x) = 0.5 ||x - e_i||^2, written from the paper's Algorithm 1 (with
  ties at one instant all received before replacements start): a list of clients in
  flight scanned for the earliest arrival, each client's update in closed form (n_i
  steps of size eta at batch 1: Delta = (1 - (1 - eta)^n_i) (e_i - x)); the buffer's
  staleness-weighted updates combined by `combine(weights, rows)`, weights from
  `client_weights`."""
  x, version, now = np.zeros(len(next(iter(centers.values())))), 0, 0.0
  stream, block, seq = [], 0, 0
  flight = []  # [arrival time, seq, client, model it started from, its version]

  def dispatch():
    nonlocal block, seq
    while not stream:
      block += 1
      stream.extend(draw(block))
    client = stream.pop(0)
    flight.append([now + seconds[client], seq, client, x.copy(), version])
    seq += 1

  for _ in range(concurrency):
    dispatch()
  buffer, kept_staleness = [], []
  steps_seen = []  # per server step: (its time, the staleness of the updates it took)
  while version < steps:
    now = min(f[0] for f in flight)
    arrived = sorted((f for f in flight if f[0] == now), key=lambda f: f[1])
    flight = [f for f in flight if f[0] != now]
    for _, _, client, start, started in arrived:
      tau = version - started
      if max_staleness is not None and tau > max_staleness:
        continue
      weight = 1.0 if staleness == 'constant' else 1 / np.sqrt(1 + tau)
      delta = (1 - (1 - eta) ** counts[client]) * (centers[client] - start)
      buffer.append((client_weights[client], weight * delta))
      kept_staleness.append(tau)
      if len(buffer) == buffer_size:
        weights, rows = (np.array(part, np.float64) for part in zip(*buffer))
        x = x + eta_s * combine(weights, rows)
        buffer, version = [], version + 1
        steps_seen.append((now, kept_staleness[-buffer_size:]))
    for _ in arrived:
      dispatch()
  return x, kept_staleness, steps_seen[:steps]


def _clipped_mean(norm):
  def combine(weights, rows):
    lengths = np.linalg.norm(rows, axis=1, keepdims=True)
    return weights @ (rows * np.minimum(1.0, norm / np.maximum(lengths, 1e-30))) / weights.sum()

  return combine


# Aggregator chains over each step's arrivals: settings and the NumPy combine.
CHAINS = {
  'mean': ({}, None),
  'median': (
    dict(aggregator='median', client_weighting='uniform', buffer_size=3),
    lambda weights, rows: np.median(rows, axis=0),
  ),
  'clip': (dict(aggregator='clip', clip_norm=0.05), _clipped_mean(0.05)),
}


@pytest.mark.parametrize(
  'staleness,max_staleness,devices,chain',
  [
    ('poly', None, True, 'mean'),
    ('constant', 2, True, 'mean'),
    # Equal times: two steps at each instant, the second with no client started
    # between them (the loop runs it all the same).
    ('poly', None, False, 'mean'),
    ('poly', None, True, 'median'),
    ('poly', 2, True, 'clip'),
  ],
)
def test_equals_a_numpy_event_simulation_of_fedbuff(
  tmp_path, staleness, max_staleness, devices, chain
):
  chain_settings, combine = CHAINS[chain]
  settings = dict(
    dict(
      rounds=50,
      mode='async',
      concurrency=4,
      buffer_size=2,
      staleness=staleness,
      max_staleness=max_staleness,
      client_learning_rate=0.05,
      seed=3,
      **(
        dict(device_model='lognormal', device_speed=5.0, device_speed_sigma=1.0) if devices else {}
      ),
    ),
    **chain_settings,
  )
  buffer_size = settings['buffer_size']
  prepared, buffered = _run(tmp_path, f'async-{staleness}', **settings)
  data = prepared.task.train_data
  ids = list(data.client_ids)
  examples = [streaming.read_client(data, c) for c in ids]
  centers = {c: np.asarray(e[0][0], np.float64) for c, e in zip(ids, examples)}
  counts = {c: len(e[1]) for c, e in zip(ids, examples)}
  # The inputs the schedule takes: the devices' times and the sampler's draws.
  config = prepared.config
  clock = devices_lib.clock_for(
    config.devices, data, experiment.build_runner(prepared).algorithm, config.seed
  )
  draws = sampling.ClientSampler(ids, buffer_size, config.seed)
  if settings.get('client_weighting') == 'uniform':
    counts_weights = dict.fromkeys(ids, 1)
  else:
    counts_weights = counts
  want, kept, steps_seen = _reference(
    centers,
    counts,
    {c: clock.seconds(c) if clock else 1.0 for c in ids},
    lambda r: draws.sample(r).sampled,
    concurrency=4,
    buffer_size=buffer_size,
    steps=50,
    eta=0.05,
    eta_s=1.0,
    staleness=staleness,
    max_staleness=max_staleness,
    client_weights=counts_weights,
    **({} if combine is None else {'combine': combine}),
  )
  np.testing.assert_allclose(buffered.weights[0], want, rtol=1e-5, atol=1e-6)
  # The run was asynchronous: stale updates arrived (and, with a cut, some dropped).
  assert max(kept) >= 1 and len(set(kept)) >= (3 if devices else 2)
  assert sum(
    r['train/async/staleness_mean'] * r['train/async/arrivals'] for r in buffered.rows
  ) == pytest.approx(sum(kept))
  if max_staleness is not None:
    assert sum(r['train/async/dropped'] for r in buffered.rows) > 0
  # Each step's clock, its length and its staleness columns, as the simulation's.
  times = [t for t, _ in steps_seen]
  np.testing.assert_allclose([r['time/simulated_seconds'] for r in buffered.rows], times)
  np.testing.assert_allclose(
    [r['time/round_seconds'] for r in buffered.rows], np.diff(times, prepend=0.0), atol=1e-9
  )
  assert [r['train/async/staleness_max'] for r in buffered.rows] == [max(s) for _, s in steps_seen]
  if devices:  # steps whose max is not their mean
    assert any(max(s) > np.mean(s) for _, s in steps_seen)
  if chain == 'clip':  # the clip was active
    assert sum(r['train/aggregator/clipped_count'] for r in buffered.rows) > 0


@pytest.mark.parametrize(
  'settings,match',
  [
    (dict(algorithm='scaffold'), 'aggregated as slots'),
    (dict(algorithm='fednova'), 'not a weighted mean'),
    (dict(algorithm='fedavg', sampling='poisson'), 'uniformly'),
    (dict(algorithm='fedavg', device_model='lognormal', round_deadline=1.0), 'max_staleness'),
    (dict(algorithm='fedavg', runtime='tff'), 'in-process runtime'),
    (dict(algorithm='fedavg', ray_address='local'), 'in-process runtime.*not ray'),
    (dict(algorithm='fedavg', concurrency=7), 'may not exceed the task.s 6 clients'),
    (
      dict(algorithm='fedavg', aggregator='dp', noise_multiplier=1.0, clip_norm=1.0),
      "DP's accounting",
    ),
    (
      dict(algorithm='fedavg', compression='top_k', error_feedback='ef'),
      'keeps a row per client',
    ),
  ],
)
def test_what_async_cannot_run_is_refused_in_one_line(tmp_path, monkeypatch, settings, match):
  # Before any runtime starts (a local Ray cluster took 30 s to start, then was refused).
  monkeypatch.setattr(ray_cluster, 'connect', lambda *_: pytest.fail('Ray started'))
  prepared = experiment.prepare(
    experiment.ExperimentConfig.of(
      task='quadratic', rounds=2, mode='async', output_dir=str(tmp_path), **settings
    )
  )
  with pytest.raises(experiment.ConfigError, match=match):
    experiment.build_runner(prepared)


@pytest.mark.parametrize('chain', [pytest.param({}, marks=pytest.mark.slow), ROTATE_QUANTIZE])
def test_a_resumed_run_equals_an_uninterrupted_one(tmp_path, chain):
  settings = dict(
    **chain,
    mode='async',
    concurrency=5,
    buffer_size=2,
    device_model='lognormal',
    device_speed=5.0,
    device_speed_sigma=1.0,
    client_learning_rate=0.05,
    seed=4,
    checkpoint_every=4,
  )
  _, whole = _run(tmp_path, 'whole', rounds=20, **settings)
  _run(tmp_path, 'cut', rounds=10, **settings)  # stopped at step 10, in-flight saved
  _, resumed = _run(tmp_path, 'cut', rounds=20, resume=True, **settings)
  np.testing.assert_array_equal(resumed.weights[0], whole.weights[0])
  assert len(resumed.rows) == 10
  for got, want in zip(resumed.rows, whole.rows[10:]):
    assert got['train/client_work/train_loss'] == want['train/client_work/train_loss']
    assert got['time/simulated_seconds'] == want['time/simulated_seconds']


def test_a_grid_runs_each_trial_on_its_own_schedule(tmp_path):
  from tff_comp import trials

  common = dict(
    algorithm='fedavg',
    task='quadratic',
    rounds=12,
    eval_period=12,
    mode='async',
    concurrency=4,
    buffer_size=2,
    device_model='lognormal',
    device_speed=5.0,
    device_speed_sigma=1.0,
  )
  configs = [
    experiment.ExperimentConfig.of(
      seed=seed, client_learning_rate=lr, output_dir=str(tmp_path / f'grid{seed}'), **common
    )
    for seed, lr in ((1, 0.05), (2, 0.02))
  ]
  said = []
  results = trials.run_trials([trials.Trial(c) for c in configs], say=said.append)
  assert any(re.search(r'buffered async .* runs one trial at a time', line) for line in said)
  for config, result in zip(configs, results):
    alone = experiment.run_experiment(
      experiment.prepare(
        experiment.ExperimentConfig.of(
          **dict(
            common,
            seed=config.seed,
            client_learning_rate=config.local_work.client_learning_rate,
            output_dir=config.output_dir + '-alone',
          )
        )
      ),
      show_progress=False,
    )
    assert result['eval/objective'] == alone['eval/objective']
