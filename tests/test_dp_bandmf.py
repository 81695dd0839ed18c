"""`--aggregator=dp_bandmf` (BandMF, `ops.privacy`): epsilon as the Gaussian mechanism of
z / sqrt(k) for k participations, the bands and rounds a run records, the refusals of
what it cannot account, the same rounds on the in-process and TFF runtimes, and a resumed
run equal to an uninterrupted one. The strategy and the noise: tests/test_bandmf.py."""

import csv
import math

from dp_accounting import rdp
import numpy as np
import pytest

from tests import algorithm_cases, interrupted
from tff_comp import accounting, experiment, strategy_cache
from tff_comp.config import privacy_settings
from tff_comp.ops import privacy
from tff_comp.run import outputs, sampling
from tff_comp.runtime import inprocess, tff_process

_ORDERS = np.array([1 + x / 10 for x in range(1, 100)] + list(range(11, 64)) + [128, 256, 512])


@pytest.mark.parametrize('rounds', [1, 5, 6, 13])
def test_epsilon_is_the_gaussian_mechanism_of_z_over_sqrt_k(rounds):
  """Epochs of 5 rounds: k = ceil(t / 5) participations, RDP alpha k / (2 z^2)."""
  z, delta = 2.0, 1e-5
  ledger = accounting.Ledger(z, 4, 20, 'cyclic', delta, bands=5, epoch=5)
  k = math.ceil(rounds / 5)
  want = rdp.rdp_privacy_accountant.compute_epsilon(_ORDERS, _ORDERS * k / (2 * z**2), delta)[0]
  assert ledger.epsilon(rounds) == pytest.approx(want, rel=1e-6)
  assert ledger.per_round()(rounds) == ledger.epsilon(rounds)
  assert 'BandMF with 5 bands' in ledger.assumption


def test_the_noise_calibrated_to_a_target_spends_it():
  options = dict(clients_per_round=5, population=100, sampling='cyclic', delta=1e-5)
  z = accounting.calibrate(3.0, 60, bands=8, epoch=20, **options)
  ledger = accounting.Ledger(z, 5, 100, 'cyclic', 1e-5, bands=8, epoch=20)
  assert ledger.epsilon(60) == pytest.approx(3.0, abs=2e-3)


def _plan(recorded=None, **options):
  settings = dict(clip_norm=1.0, noise_multiplier=1.0)
  settings.update({k: options.pop(k) for k in list(options) if k in settings})
  run = dict(clients_per_round=4, population=50, rounds=30, sampling='cyclic', min_separation=0)
  run.update({k: options.pop(k) for k in list(options) if k in run})
  aggregator = options.pop('aggregator', 'dp_bandmf')
  return privacy_settings.PrivacyOptions(**settings, **options).plan(
    aggregator, **run, recorded=recorded
  )


def test_a_noise_cohorts_epoch_is_the_accounted_cohorts():
  """--noise_cohort_size M: a client's rounds are N // M apart in the accounting (N // n
  understated epsilon: 5.50 reported where 8.89 is spent)."""
  plan = _plan(noise_cohort_size=10, population=200, rounds=40)
  assert plan.ledger.epoch == plan.resolved['bands'] == 20  # 200 // 10, not 200 // 4


def test_the_bands_default_to_an_epoch_and_what_cannot_be_accounted_is_refused():
  plan = _plan()
  assert plan.ledger.bands == plan.ledger.epoch == 12  # 50 // 4
  assert plan.resolved['bands'] == 12 and plan.resolved['strategy_rounds'] == 30
  assert plan.mean.strategy == strategy_cache.strategy(30, 12)
  (_, noise) = plan.mean.chain().stages
  assert noise.strategy.band.shape == (30, 12) and noise.stddev == 1.0
  assert _plan(bands=4).mean.strategy.bands == 4
  assert _plan(rounds=5).resolved['bands'] == 5  # not over the rounds
  for options, says in (
    (dict(bands=13), 'at least 13 apart; here they are 12 apart'),
    (dict(sampling='uniform'), "each client's rounds at least --bands apart"),
    (dict(sampling='poisson'), "each client's rounds at least --bands apart"),
    (dict(accountant='pld'), 'RDP accountant'),
    (dict(bands=31), 'over the run'),
  ):
    with pytest.raises(ValueError, match=says):
      _plan(**options)
  # A resumed run keeps its strategy's rounds: it cannot run past them.
  assert _plan(recorded=dict(strategy_rounds=40)).mean.strategy.rounds == 40
  with pytest.raises(ValueError, match='covers the 20 rounds the run began with'):
    _plan(recorded=dict(strategy_rounds=20))


def test_a_bandmf_run_is_the_same_in_process_and_on_tffs_runtime():
  """The chain's noise is seeded by (run seed, round) on both (a run seed not 0: a
  runtime seeding its chain with 0 is caught); two bands over 4 rounds."""

  def algorithm(z):
    spec = privacy.BandedNoisedMean(0.5, z, 2.0, strategy=strategy_cache.strategy(4, 2))
    return algorithm_cases.algorithm(
      'fedavg', dict(model_aggregator=spec, client_weighting='uniform', seed=7)
    )

  data = algorithm_cases.DATA['unequal']
  got = algorithm_cases.cyclic_rounds(inprocess.build(algorithm(0.8), data, engine='mapped'), 4)
  want = algorithm_cases.cyclic_rounds(tff_process.build_tff(algorithm(0.8), data), 4)
  for a, b in zip(got, want, strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  plain = algorithm_cases.cyclic_rounds(inprocess.build(algorithm(0.0), data, engine='mapped'), 4)
  assert max(np.abs(np.asarray(a) - np.asarray(b)).max() for a, b in zip(got, plain)) > 1e-3


ARGS = dict(
  algorithm='fedavg',
  task='quadratic',
  rounds=7,
  eval_period=7,
  checkpoint_every=2,
  aggregator='dp_bandmf',
  clip_norm=0.5,
  noise_multiplier=1.0,
  sampling='cyclic',
  clients_per_round=2,  # of the task's 6: epochs of 3 rounds
  engine='mapped',
)


def test_a_resumed_bandmf_run_equals_the_uninterrupted_one(tmp_path):
  """The last b - 1 noise vectors are in the checkpoint; the rounds' draws are stateless."""
  config = experiment.ExperimentConfig.of
  interrupted.train(config(output_dir=str(tmp_path / 'whole'), **ARGS))
  with pytest.raises(KeyboardInterrupt):  # rounds 1-5 done, saved at 4
    interrupted.train(config(output_dir=str(tmp_path / 'resumed'), **ARGS), interrupt_at=6)
  interrupted.train(config(output_dir=str(tmp_path / 'resumed'), resume=True, **ARGS))
  models = [
    outputs.load_model(tmp_path / k / 'final_model.npz').trainable for k in ('whole', 'resumed')
  ]
  for a, b in zip(*models, strict=True):
    np.testing.assert_array_equal(a, b)
  with open(tmp_path / 'whole' / 'metrics.csv', newline='') as f:
    epsilon = [float(r['privacy/epsilon']) for r in csv.DictReader(f) if r['privacy/epsilon']]
  ledger = accounting.Ledger(1.0, 2, 6, 'cyclic', 6**-1.1, bands=3, epoch=3)
  assert epsilon[-1] == pytest.approx(ledger.epsilon(7), rel=1e-6)
  with pytest.raises(experiment.ConfigError, match='cannot be extended to 9'):
    experiment.prepare(
      config(output_dir=str(tmp_path / 'whole'), resume=True, **dict(ARGS, rounds=9))
    )


def test_min_separation_keeps_each_clients_rounds_apart_and_replays_from_the_seed():
  """Uniform draws among the clients the previous s - 1 rounds did not sample: over 60
  rounds no client twice within 4 rounds, every client drawn, and any round's cohort
  the same from a fresh sampler (a resume) as from the one that drew them in order."""
  ids = [f'c{i}' for i in range(20)]
  participation = sampling.Participation('uniform', min_separation=4)
  sampler = sampling.ClientSampler(ids, 3, 7, participation)
  cohorts = [sampler.sample(r).sampled for r in range(1, 61)]
  last = {}
  for r, cohort in enumerate(cohorts):
    assert len(set(cohort)) == 3
    for c in cohort:
      assert r - last.get(c, -10) >= 4, (c, r)
      last[c] = r
  assert set(last) == set(ids)
  assert sampling.ClientSampler(ids, 3, 7, participation).sample(45).sampled == cohorts[44]
  plain = sampling.ClientSampler(ids, 3, 7, sampling.Participation('uniform'))
  assert any(  # the bound is the sampler's, not chance's
    set(plain.sample(r).sampled) & set(plain.sample(r + 1).sampled) for r in range(1, 30)
  )
  with pytest.raises(ValueError, match='needs at least 24 clients'):
    sampling.ClientSampler(ids, 6, 7, participation)
  with pytest.raises(ValueError, match='bounds uniform sampling'):
    sampling.Participation('poisson', min_separation=4)


def test_min_separation_is_accounted_for_bandmf_and_trees_and_refused_for_dp():
  plan = _plan(sampling='uniform', min_separation=5)
  assert plan.ledger.sampling == 'separated' and plan.ledger.bands == plan.ledger.epoch == 5
  assert '(--min_separation)' in plan.ledger.assumption
  with pytest.raises(ValueError, match='at least 6 apart; here they are 5 apart'):
    _plan(sampling='uniform', min_separation=5, bands=6)
  tree = _plan(aggregator='dp_ftrl_tree', sampling='uniform', min_separation=5)
  assert tree.ledger.restart_every == 5
  with pytest.raises(ValueError, match='over the --min_separation of 5 rounds'):
    _plan(aggregator='dp_ftrl_tree', sampling='uniform', min_separation=5, restart_every=6)
  with pytest.raises(ValueError, match='--min_separation amplifies no'):
    _plan(aggregator='dp', sampling='uniform', min_separation=5)
