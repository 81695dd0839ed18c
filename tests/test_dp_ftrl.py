"""`--aggregator=dp_ftrl_tree` (DP-FTRL's tree aggregation, `ops.privacy`): the cyclic
participation its accounting assumes, epsilon against the tree's closed-form RDP, the
refusals of what it cannot account, the same rounds on the in-process and TFF runtimes,
and a resumed run equal to an uninterrupted one (the tree's nodes are stateless). The
noise itself is TFP's tree (tests/test_tree_noise.py)."""

import csv
import math

from dp_accounting import rdp
import numpy as np
import pytest

from tests import algorithm_cases, interrupted
from tff_comp import accounting, experiment
from tff_comp.config import privacy_settings
from tff_comp.ops import privacy
from tff_comp.run import outputs, sampling
from tff_comp.runtime import inprocess, tff_process


def test_cyclic_participation_takes_each_client_once_an_epoch_in_one_order():
  ids = [f'c{i}' for i in range(11)]
  sampler = sampling.ClientSampler(ids, 3, 5, sampling.Participation('cyclic'))
  epoch = sampling.epoch_rounds(11, 3)
  assert epoch == 3
  cohorts = [sampler.sample(r).reporting for r in range(1, 2 * epoch + 1)]
  assert all(len(c) == 3 for c in cohorts)
  first = [c for cohort in cohorts[:epoch] for c in cohort]
  assert len(set(first)) == 9  # once each; 11 % 3 = 2 clients never
  assert cohorts[epoch:] == cohorts[:epoch]  # the same order every epoch
  again = sampling.ClientSampler(ids, 3, 5, sampling.Participation('cyclic'))
  assert again.sample(5).reporting == cohorts[4]  # a round's cohort from (seed, round)
  other = sampling.ClientSampler(ids, 3, 6, sampling.Participation('cyclic'))
  assert [other.sample(r).reporting for r in (1, 2, 3)] != cohorts[:3]


@pytest.mark.parametrize('rounds', [1, 7, 8, 20])
def test_epsilon_is_the_trees_closed_form_rdp(rounds):
  """Trees of k rounds compose; each has RDP alpha ceil(log2(k + 1)) / (2 z^2) (the
  last tree's rounds so far), converted to epsilon at delta."""
  z, k, delta = 1.3, 8, 1e-5
  ledger = accounting.Ledger(z, 4, 1000, 'cyclic', delta, restart_every=k)
  trees, rest = divmod(rounds, k)
  depth = trees * math.ceil(math.log2(k + 1)) + (math.ceil(math.log2(rest + 1)) if rest else 0)
  orders = np.array([1 + x / 10 for x in range(1, 100)] + list(range(11, 64)) + [128, 256, 512])
  want = rdp.rdp_privacy_accountant.compute_epsilon(orders, orders * depth / (2 * z**2), delta)[0]
  assert ledger.epsilon(rounds) == pytest.approx(want, rel=1e-6)
  assert ledger.per_round()(rounds) == ledger.epsilon(rounds)
  assert 'tree aggregation restarted every 8 rounds' in ledger.assumption


def test_the_noise_calibrated_to_a_target_spends_it():
  z = accounting.calibrate(
    4.0,
    30,
    clients_per_round=5,
    population=100,
    sampling='cyclic',
    delta=1e-5,
    restart_every=20,
  )
  ledger = accounting.Ledger(z, 5, 100, 'cyclic', 1e-5, restart_every=20)
  assert ledger.epsilon(30) == pytest.approx(4.0, abs=2e-3)


def _plan(**options):
  settings = dict(clip_norm=1.0, noise_multiplier=1.0)
  run = dict(clients_per_round=4, population=50, rounds=30, sampling='cyclic')
  run.update({k: options.pop(k) for k in list(options) if k in run})
  return privacy_settings.PrivacyOptions(**settings, **options).plan('dp_ftrl_tree', **run)


def test_the_tree_restarts_every_epoch_by_default_and_never_spans_two():
  plan = _plan()
  assert plan.mean.restart_every == plan.ledger.restart_every == 12  # 50 // 4
  assert plan.resolved['restart_every'] == 12
  assert _plan(restart_every=5).mean.restart_every == 5
  for options, says in (
    (dict(restart_every=13), 'over the 12 rounds of a cyclic epoch'),
    (dict(sampling='uniform'), 'in at most one round of a tree'),
    (dict(sampling='poisson'), 'in at most one round of a tree'),
    (dict(accountant='pld'), 'RDP accountant'),
  ):
    with pytest.raises(ValueError, match=says):
      _plan(**options)
  with pytest.raises(ValueError, match='cyclic participation amplifies no'):
    privacy_settings.PrivacyOptions(clip_norm=1.0, noise_multiplier=1.0).plan(
      'dp', clients_per_round=4, population=50, rounds=30, sampling='cyclic'
    )
  with pytest.raises(experiment.ConfigError, match='restart_every'):
    experiment.ExperimentConfig.of(
      algorithm='fedavg', aggregator='dp', clip_norm=1.0, noise_multiplier=1.0, restart_every=3
    ).check()


def test_a_tree_run_is_the_same_in_process_and_on_tffs_runtime():
  """The chain's nodes are seeded by (run seed, tree, level, index) on both (a run seed
  not 0: a runtime seeding its chain with 0 is caught); two trees of two rounds, then
  the third's first."""
  spec = privacy.TreeNoisedMean(0.5, 0.8, 2.0, restart_every=2)
  algorithm = algorithm_cases.algorithm(
    'fedavg', dict(model_aggregator=spec, client_weighting='uniform', seed=7)
  )
  data = algorithm_cases.DATA['unequal']
  noiseless = algorithm_cases.algorithm(
    'fedavg',
    dict(
      model_aggregator=privacy.TreeNoisedMean(0.5, 0.0, 2.0, restart_every=2),
      client_weighting='uniform',
      seed=7,
    ),
  )
  got = algorithm_cases.cyclic_rounds(inprocess.build(algorithm, data, engine='mapped'), 5)
  want = algorithm_cases.cyclic_rounds(tff_process.build_tff(algorithm, data), 5)
  for a, b in zip(got, want, strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  plain = algorithm_cases.cyclic_rounds(inprocess.build(noiseless, data, engine='mapped'), 5)
  assert max(np.abs(np.asarray(a) - np.asarray(b)).max() for a, b in zip(got, plain)) > 1e-3


ARGS = dict(
  algorithm='fedavg',
  task='quadratic',
  rounds=7,
  eval_period=7,
  checkpoint_every=2,
  aggregator='dp_ftrl_tree',
  clip_norm=0.5,
  noise_multiplier=1.0,
  sampling='cyclic',
  clients_per_round=2,  # of the task's 6: epochs of 3 rounds
  restart_every=3,
  engine='mapped',
)


def _train(path, interrupt_at=None, **changes):
  config = experiment.ExperimentConfig.of(output_dir=str(path), **ARGS, **changes)
  return interrupted.train(config, interrupt_at)


def test_a_resumed_tree_run_equals_the_uninterrupted_one(tmp_path):
  _train(tmp_path / 'whole')
  with pytest.raises(KeyboardInterrupt):
    _train(tmp_path / 'resumed', interrupt_at=6)  # rounds 1-5 done, saved at 4
  _train(tmp_path / 'resumed', resume=True)
  models = [
    outputs.load_model(tmp_path / k / 'final_model.npz').trainable for k in ('whole', 'resumed')
  ]
  for a, b in zip(*models, strict=True):
    np.testing.assert_array_equal(a, b)
  with open(tmp_path / 'whole' / 'metrics.csv', newline='') as f:
    epsilon = [float(r['privacy/epsilon']) for r in csv.DictReader(f) if r['privacy/epsilon']]
  assert epsilon[-1] == pytest.approx(
    accounting.Ledger(1.0, 2, 6, 'cyclic', 6**-1.1, restart_every=3).epsilon(7), rel=1e-6
  )


def test_a_noise_cohort_scales_the_trees_nodes_and_is_accounted_as_that_cohort():
  plan = _plan(noise_cohort_size=40)
  _, tree = plan.mean.chain().stages
  assert tree.stddev == pytest.approx(1.0 * 1.0 * 4 / 40)  # z C n / M
  assert plan.ledger.clients_per_round == 40
  # The accounting's cyclic epoch is N // M = 1 round, each tree one round: a tree of
  # N // n = 12 would hold 10 participations of an accounted client (#73, #75).
  assert plan.mean.restart_every == plan.ledger.restart_every == plan.ledger.epoch == 1
  tenfold = _plan(noise_cohort_size=10, population=200)
  assert tenfold.ledger.restart_every == 20 and tenfold.ledger.epoch == 20  # 200 // 10
  with pytest.raises(ValueError, match='over the 20 rounds of a cyclic epoch'):
    _plan(noise_cohort_size=10, population=200, restart_every=21)
  dp = privacy_settings.PrivacyOptions(
    clip_norm=1.0, noise_multiplier=1.0, noise_cohort_size=40
  ).plan('dp', clients_per_round=4, population=50, rounds=30, sampling='poisson')
  assert 'q = 40/50' in dp.ledger.assumption
  with pytest.raises(ValueError, match='over the population'):
    _plan(noise_cohort_size=51)
  with pytest.raises(ValueError, match='at least the one of a round'):
    _plan(noise_cohort_size=3)
  with pytest.raises(ValueError, match='noise_cohort_size does not apply to dp_adaptive'):
    privacy.AdaptiveGaussianMean(1.0, 1.0, 4.0, noise_cohort_size=40)


def test_cyclic_participation_with_a_device_model_is_refused_in_one_line(tmp_path):
  config = experiment.ExperimentConfig.of(
    algorithm='fedavg',
    task='quadratic',
    sampling='cyclic',
    device_model='lognormal',
    output_dir=str(tmp_path),
  )
  with pytest.raises(experiment.ConfigError, match='--sampling=cyclic takes fixed blocks'):
    experiment.prepare(config)
