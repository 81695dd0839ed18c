"""Clipping and DP on both runtimes (`ops.privacy`, `aggregation_factories.privacy_factory`) and
their accounting (`accounting`): TFF's factories are the reference for the math, TF's
clip_by_global_norm for clipping, dp_accounting's worked example for the accountant."""

import dataclasses
import json

import numpy as np
import pytest
import tensorflow as tf

from tests import algorithm_cases
from tff_comp import accounting, experiment, registry, strategy_cache
from tff_comp.config import privacy_settings
from tff_comp.ops import privacy
import tff_comp.ops.aggregators as agg
from tff_comp.run import checkpoints, outputs
from tff_comp.runtime import choice

DATA, MODEL = algorithm_cases.DATA['unequal'], algorithm_cases.MODEL
IDS = list(DATA.client_ids)


def _algorithm(name: str, spec: privacy.PrivateMean):
  extra = dict(model_aggregator=spec, client_learning_rate=0.1)
  if spec.private and registry.get_algorithm(name).accepts('client_weighting'):
    extra['client_weighting'] = 'uniform'
  return registry.get_algorithm(name).build(MODEL, **algorithm_cases.arguments(name, extra))


def _run(algorithm, runtime_name: str, rounds: int = 3):
  # In process on the mapped engine: clipping and noise are the round end's, alike on
  # every engine (the engines' client outputs agree in test_inprocess.py), and its first
  # round compiles no XLA kernel.
  extra = dict(engine='mapped') if runtime_name == 'inprocess' else {}
  runtime, _ = choice.runner_for(algorithm, DATA, runtime_name, **extra)
  state = runtime.initialize()
  for r in range(rounds):
    output = runtime.next(state, IDS[r : r + 3])
    state = output.state
  return runtime.get_model_weights(state).trainable, output.metrics['aggregator']


@pytest.mark.parametrize('z, stddev', [(0.5, None), (1.0, 2.0), (0.0, None)])
def test_adaptive_value_noise_is_tffs(z, stddev):
  from tensorflow_federated.python.aggregators import differential_privacy

  spec = privacy.AdaptiveGaussianMean(0.1, z, 20.0, clipped_count_stddev=stddev)
  want = differential_privacy.adaptive_clip_noise_params(z, 20.0, stddev)
  np.testing.assert_allclose((spec.value_noise_multiplier, spec.count_stddev), want)


def _quiet(kind: str, clip_norm: float) -> privacy.PrivateMean:
  """The registered mechanism `kind` with z = 0 for 3 clients a round (an adaptive
  clip moving fast; BandMF's factorization for 3 rounds, 2 bands)."""
  mechanism = registry.MECHANISMS.get(kind).builder
  given = dict(
    clip_norm=clip_norm,
    clients_per_round=3.0,
    clip_learning_rate=0.5,
    strategy=strategy_cache.strategy(3, 2),
  )
  fields = {f.name for f in dataclasses.fields(mechanism)}
  return mechanism(**{k: v for k, v in given.items() if k in fields})


# Clipping and the adaptive clip on one algorithm by default (dp's z = 0 is the
# clipped mean); every pair under make test-slow.
@pytest.mark.parametrize(
  'kind,name',
  [
    pytest.param(
      kind,
      name,
      id=f'{kind}-{name}',
      marks=()
      if ((kind, name) in (('clip', 'fedavg'), ('dp_adaptive', 'fedavg')))
      else pytest.mark.slow,
    )
    for kind in registry.MECHANISMS.names()
    for name in ('fedavg', 'fednova')
  ],
)
def test_without_noise_the_in_process_round_is_tffs_factory(name, kind):
  """z = 0: the in-process clipped mean equals TFF's clipping_factory / DP factory run
  on TFF's runtime, the adaptive clip moving alike (1e-5, 3 rounds)."""
  spec = _quiet(kind, 0.05)
  fast, fast_measured = _run(_algorithm(name, spec), 'inprocess')
  slow, slow_measured = _run(_algorithm(name, spec), 'tff')
  plain, _ = _run(_algorithm(name, _quiet(kind, 1e6)), 'inprocess')
  assert max(np.abs(a - b).max() for a, b in zip(fast, plain)) > 1e-3  # clipping bites
  for a, b in zip(fast, slow):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  fast_flat = outputs.flatten_metrics(fast_measured)
  slow_flat = outputs.flatten_metrics(slow_measured)
  shared = set(fast_flat) & set(slow_flat)
  if spec.adaptive:
    assert any(k.endswith('dp_query_metrics/clip') for k in shared)
  if not spec.private:
    assert any(k.endswith('clipped_count') for k in shared)
  for key in shared:
    np.testing.assert_allclose(fast_flat[key], slow_flat[key], rtol=1e-5)


def _noise_samples(spec: privacy.PrivateMean, rounds: int) -> np.ndarray:
  """W(z) - W(z=0) after one round from the same state, for rounds 0..rounds-1 (the
  round seeds the noise): n x the noise the server adds to the mean."""
  # The mapped engine, as in `_run`.
  noisy, _ = choice.runner_for(_algorithm('fedavg', spec), DATA, 'inprocess', engine='mapped')
  quiet, _ = choice.runner_for(
    _algorithm('fedavg', privacy.GaussianMean(spec.clip_norm, 0.0, 3.0)),
    DATA,
    'inprocess',
    engine='mapped',
  )
  state, samples = quiet.initialize(), []
  for r in range(rounds):
    start = state._replace(client_work=state.client_work._replace(round=tf.constant(r)))
    a = noisy.get_model_weights(noisy.next(start, IDS[:3]).state).trainable
    b = quiet.get_model_weights(quiet.next(start, IDS[:3]).state).trainable
    samples.append(np.concatenate([np.ravel(x - y) for x, y in zip(a, b)]))
  return np.stack(samples)


def test_the_noise_has_mean_zero_and_std_z_c_over_n():
  z, clip, n, rounds = 1.5, 0.2, 3.0, 100
  samples = _noise_samples(privacy.GaussianMean(clip, z, n), rounds)
  sigma, count = z * clip / n, samples.size  # server learning rate 1: W moves by the mean
  assert abs(samples.mean()) < 5 * sigma / np.sqrt(count)
  assert abs(samples.std() / sigma - 1) < 5 / np.sqrt(2 * count)
  assert len({tuple(row) for row in np.round(samples, 7)}) == rounds  # a draw per round
  np.testing.assert_array_equal(
    samples[:5], _noise_samples(privacy.GaussianMean(clip, z, n), 5)
  )  # fixed by the run and the round


def test_a_noise_cohort_gives_the_mean_its_noise_z_c_over_m():
  """--noise_cohort_size M: the sum of n clients is noised by z C n / M, so the mean
  moves by the noise a cohort of M would see (pfl-research's noise_cohort_size)."""
  z, clip, n, m, rounds = 1.5, 0.2, 3.0, 30.0, 100
  samples = _noise_samples(privacy.GaussianMean(clip, z, n, noise_cohort_size=m), rounds)
  sigma, count = z * clip / m, samples.size
  assert abs(samples.mean()) < 5 * sigma / np.sqrt(count)
  assert abs(samples.std() / sigma - 1) < 5 / np.sqrt(2 * count)


def test_a_weighted_aggregation_is_refused_by_dp():
  with pytest.raises(ValueError, match="client_weighting='uniform'"):
    registry.get_algorithm('fedavg').build(
      MODEL,
      **algorithm_cases.arguments(
        'fedavg', dict(model_aggregator=privacy.GaussianMean(1.0, 1.0, 3.0))
      ),
    )
  with pytest.raises(ValueError, match='per-client weights'):
    _algorithm('afl', privacy.GaussianMean(1.0, 1.0, 3.0))


# --- accounting ---------------------------------------------------------------------


def test_the_accountant_reproduces_dp_accountings_worked_example():
  """dp_accounting's rdp test: noise multiplier 4.530877117 makes one Gaussian
  mechanism (1, 1e-6)-DP. Full participation, one round."""
  ledger = accounting.Ledger(4.530877117, 10, 10, 'poisson', 1e-6)
  assert ledger.epsilon(1) == pytest.approx(1.0, abs=1e-4)
  assert accounting.Ledger(4.530877117, 10, 10, 'poisson', 1e-6, 'pld').epsilon(1) < 1.0


def test_sampling_amplifies_privacy_and_epsilon_grows_with_rounds():
  full = accounting.Ledger(1.0, 100, 100, 'poisson', 1e-4)
  sampled = accounting.Ledger(1.0, 10, 100, 'poisson', 1e-4)
  assert sampled.epsilon(50) < full.epsilon(50) / 3
  per_round = sampled.per_round()
  epsilons = [per_round(t) for t in (1, 10, 100, 400)]
  assert epsilons == sorted(epsilons)
  for t in (1, 37, 400):
    assert per_round(t) == pytest.approx(sampled.epsilon(t), rel=1e-9)
  uniform = accounting.Ledger(1.0, 10, 100, 'uniform', 1e-4)
  assert uniform.per_round()(37) == pytest.approx(uniform.epsilon(37), rel=1e-9)
  assert accounting.Ledger(0.0, 10, 100, 'poisson', 1e-4).epsilon(3) == np.inf


@pytest.mark.parametrize(
  'sampling, accountant',
  [('poisson', 'rdp'), ('uniform', 'rdp'), pytest.param('poisson', 'pld', marks=pytest.mark.slow)],
)
def test_calibration_spends_the_target_over_the_rounds(sampling, accountant):
  z = accounting.calibrate(
    2.0,
    200,
    clients_per_round=10,
    population=500,
    sampling=sampling,
    delta=1e-4,
    accountant=accountant,
  )
  ledger = accounting.Ledger(z, 10, 500, sampling, 1e-4, accountant)
  assert 1.99 < ledger.epsilon(200) <= 2.0
  if accountant == 'rdp':  # (PLD's 0.3 s a call: the search is the same code)
    assert ledger.rounds_within(2.0, 1000) == 200


@pytest.mark.parametrize(
  'target, says', [(1e-4, 'above 1000.0'), (1e5, r'below 0.05 .* \(there epsilon is 3.55e\+04\)')]
)
def test_a_target_no_noise_multiplier_in_range_reaches_is_one_line(target, says):
  """The search's bracket (z from 0.05, PLD's from 0.3, to 1000) ends at its limits
  with a message naming the limit and the epsilon spent there."""
  with pytest.raises(ValueError, match=says):
    accounting.calibrate(
      target, 200, clients_per_round=10, population=500, sampling='poisson', delta=1e-4
    )


@pytest.mark.parametrize(
  'args, says',
  [
    (('with_replacement', 'rdp', 1e-3, 100), 'poisson or uniform'),
    (('uniform', 'pld', 1e-3, 100), 'PLD'),
    (('poisson', 'rdp', 0.01, 100), 'target_delta must be in'),
  ],
)
def test_unaccountable_runs_are_refused(args, says):
  with pytest.raises(ValueError, match=says):
    accounting.check(*args)


# --- runs ---------------------------------------------------------------------------


def _config(tmp_path, **fields):
  return experiment.ExperimentConfig.of(
    algorithm=fields.pop('algorithm', 'fedavg'),
    task='quadratic',
    rounds=fields.pop('rounds', 6),
    clients_per_round=2,
    eval_period=2,
    output_dir=str(tmp_path),
    **fields,
  )


@pytest.mark.parametrize('runtime', ['inprocess', pytest.param('tff', marks=pytest.mark.slow)])
def test_a_dp_run_writes_epsilon_every_round_and_records_its_noise(tmp_path, runtime):
  prepared = experiment.prepare(
    _config(
      tmp_path,
      aggregator='dp_adaptive',
      target_epsilon=30.0,
      clipped_count_stddev=1.0,
      runtime=runtime,
      sampling='poisson',
      client_learning_rate=0.05,
    )
  )
  experiment.run_experiment(prepared, show_progress=False)
  rows = (tmp_path / 'metrics.csv').read_text().splitlines()
  header = rows[0].split(',')
  epsilons = [float(r.split(',')[header.index('privacy/epsilon')]) for r in rows[2:]]
  assert len(epsilons) == 6 and epsilons == sorted(epsilons)
  assert epsilons[-1] == pytest.approx(30.0, rel=1e-3)
  assert any(h.endswith('dp_query_metrics/clip') for h in header)
  resolved = json.loads((tmp_path / 'config.json').read_text())['resolved']
  assert resolved['noise_multiplier'] == pytest.approx(prepared.ledger.noise_multiplier)
  assert resolved['client_weighting'] == 'uniform' and resolved['target_delta'] < 1 / 6


def test_the_run_stops_when_the_budget_is_spent_and_a_resume_stops_too(tmp_path):
  ledger = accounting.Ledger(1.0, 2, 6, 'uniform', 0.1)
  budget = ledger.epsilon(4) + 1e-6  # round 5 would exceed it
  fields = dict(
    aggregator='dp',
    clip_norm=1.0,
    noise_multiplier=1.0,
    target_delta=0.1,
    target_epsilon=budget,
    rounds=9,
    checkpoint_every=100,
  )
  experiment.run_experiment(experiment.prepare(_config(tmp_path, **fields)), show_progress=False)
  rounds = [int(r.split(',')[0]) for r in (tmp_path / 'metrics.csv').read_text().splitlines()[1:]]
  assert rounds == list(range(5))  # round 0 (the initial evaluation), then 1..4
  _, saved = checkpoints.Checkpoints(tmp_path).load_latest(
    experiment.build_runner(
      experiment.prepare(_config(tmp_path, **dict(fields, overwrite=True)))
    ).runtime.initialize()
  )
  assert saved == 4
  experiment.run_experiment(
    experiment.prepare(_config(tmp_path, resume=True, **fields)), show_progress=False
  )  # already spent: runs no round
  assert (tmp_path / 'metrics.csv').read_text().splitlines()[-1].startswith('4,')
  with pytest.raises(experiment.ConfigError, match='already spends'):
    experiment.prepare(
      _config(tmp_path / 'b', **dict(fields, target_epsilon=ledger.epsilon(1) / 2))
    )


@pytest.mark.parametrize(
  'fields, says',
  [
    (dict(clip_norm=1.0), '--aggregator=clip, dp, dp_adaptive'),
    (dict(aggregator='dp', clip_norm=1.0), '--noise_multiplier or --target_epsilon'),
    (dict(aggregator='dp', noise_multiplier=1.0), 'needs --clip_norm'),
    (dict(aggregator='clip', clip_norm=1.0, noise_multiplier=1.0), 'adds no noise'),
    (
      dict(aggregator='dp', clip_norm=1.0, noise_multiplier=1.0, target_delta=0.5),
      'target_delta must be in',
    ),
    (
      dict(aggregator='dp', clip_norm=1.0, noise_multiplier=1.0, sampling='with_replacement'),
      'poisson or uniform',
    ),
    (
      dict(aggregator='dp', clip_norm=1.0, noise_multiplier=1.0, client_weighting='examples'),
      'weighs every client alike',
    ),
    (
      dict(aggregator='dp_adaptive', noise_multiplier=1.0, clipped_count_stddev=0.4),
      'clipped_count_stddev',
    ),
    (dict(aggregator='dp', clip_norm=-1.0, noise_multiplier=1.0), 'clip_norm must be > 0'),
    (dict(aggregator='medain'), 'unknown'),
    # Settings the run's aggregator would ignore.
    (dict(clip_quantile=0.3), 'adapting clip of --aggregator=dp_adaptive'),
    (
      dict(aggregator='dp', clip_norm=1.0, noise_multiplier=1.0, clipped_count_stddev=0.4),
      '--clipped_count_stddev sets the adapting clip',
    ),
    (dict(accountant='pld'), '--accountant counts the privacy of'),
  ],
)
def test_a_bad_privacy_setting_is_one_line(tmp_path, fields, says):
  with pytest.raises(experiment.ConfigError) as error:
    experiment.prepare(_config(tmp_path, **fields))
  assert says in str(error.value) and '\n' not in str(error.value)


def test_adaptive_clipping_noises_the_clipped_count():
  """The clipped count is a private release too: its noise N(0, s^2) moves the next clip
  by exp(-lr N(0, s^2) / n) (every adaptive test elsewhere ran with z = 0, so removing
  this noise passed them). Four updates, two below the clip: the count's part is
  centred, and log(C' / C) has mean 0 and std lr s / n over noise seeds."""
  mean = privacy.AdaptiveGaussianMean(
    clip_norm=1.0,
    noise_multiplier=0.5,
    clients_per_round=4,
    clip_learning_rate=0.2,
    clipped_count_stddev=0.4,
  )
  chain = mean.chain().bind(2)
  deltas = tf.constant([[0.5, 0.0], [0.0, 0.5], [2.0, 0.0], [0.0, 2.0]])
  steps = []
  for seed in range(400):
    _, _, state, _ = chain.aggregate(
      chain.initial_state(),
      deltas,
      tf.ones([4]),
      tf.zeros([4, 0]),
      agg.client_seeds(seed, 0, tf.range(4)),
      agg.round_seed(seed, 0),
    )
    steps.append(np.log(float(state.stages[0]) / 1.0))
  assert np.mean(steps) == pytest.approx(0.0, abs=0.005)
  assert np.std(steps) == pytest.approx(0.2 * 0.4 / 4, rel=0.12)


def test_the_default_delta_is_population_to_the_minus_1_1_and_is_recorded(tmp_path):
  """delta defaults to N^-1.1 (below 1/N; McMahan et al. 2018) of the task's population,
  and the run records the value it accounted with (a changed default passed every test)."""
  for population in (10, 64, 3_400, 342_477):
    assert accounting.default_delta(population) == pytest.approx(population**-1.1, rel=1e-12)
    assert accounting.default_delta(population) < 1 / population
  prepared = experiment.prepare(
    experiment.ExperimentConfig.of(
      algorithm='fedavg',
      task='quadratic',
      aggregator='dp',
      clip_norm=1.0,
      noise_multiplier=0.5,
      client_weighting='uniform',
      clients_per_round=2,
      output_dir=str(tmp_path),
    )
  )
  assert prepared.settings.target_delta == pytest.approx(6**-1.1, rel=1e-12)


def test_the_privacy_line_gives_the_delta_it_accounts_with():
  """The run's `privacy:` line shows delta once (the default was used silently; then
  it was given twice); one of 1/population or more is refused."""
  ledger = accounting.Ledger(1.0, 10, 64, 'poisson', 64**-1.1, 'rdp')
  line = privacy_settings.privacy_line(ledger, 4.0, 100)
  assert line.startswith('privacy: noise multiplier 1; RDP accounting of Poisson sampling')
  assert line.count('delta') == 1 and 'delta = 0.0103;' in line, line
  with pytest.raises(ValueError, match='target_delta must be in'):
    accounting.Ledger(1.0, 10, 64, 'poisson', 0.05, 'rdp')
  # A tree restarting after the run's rounds is one tree, said so (#76: "restarted every
  # 340 rounds" on a 20-round run).
  tree = accounting.Ledger(1.0, 10, 3400, 'cyclic', 3400**-1.1, 'rdp', 340)
  assert privacy_settings.privacy_line(tree, None, 20).endswith(
    'delta = 0.00013 (no restart within these 20 rounds: one tree)'
  )
  assert 'one tree' not in privacy_settings.privacy_line(tree, None, 700)


def test_adaptive_clipping_defaults_work_for_small_cohorts(tmp_path):
  """TFF's default count noise (0.05 n = 0.5 for 10 clients) is at most z / 2 for a
  calibrated z of about 1.7, which refused the run: the default then takes s = z, with
  the update's noise z_v = (z^-2 - (2z)^-2)^-1/2 and the privacy of z."""
  prepared = experiment.prepare(
    experiment.ExperimentConfig.of(
      algorithm='fedavg',
      task='lasso',
      rounds=100,
      clients_per_round=10,
      aggregator='dp_adaptive',
      target_epsilon=4.0,
      output_dir=str(tmp_path),
    )
  )
  spec = prepared.builder_args['model_aggregator']
  z = spec.noise_multiplier
  assert z > 1.0 and spec.count_stddev == z
  assert spec.value_noise_multiplier == pytest.approx((z**-2 - (2 * z) ** -2) ** -0.5)
  large = privacy.AdaptiveGaussianMean(0.1, 1.0, 100.0)
  assert large.count_stddev == 5.0  # TFF's 0.05 n where it suffices
