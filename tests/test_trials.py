"""Batched trials: every trial of a group equals its separate run (weights, the whole
server state and each round's metrics), for every registered algorithm that runs
in-process, with its own learning rates, hyperparameters, seed, sampler stream (Poisson
with dropout) and shuffled local data: equal to the bit."""

import dataclasses
import inspect
import json
import re
import threading
import time
from typing import Any

import numpy as np
import pytest
import tensorflow as tf

from tests import algorithm_cases
from tff_comp import experiment, registry, trial_groups, trials
from tff_comp.config.experiment_config import ExperimentConfig
from tff_comp.ops import client_round, matrix_factorization, privacy
from tff_comp.run import callbacks, outputs, sampling
from tff_comp.runtime import inprocess
from tff_comp.runtime.inprocess import engines
from tff_comp.runtime.inprocess import trials as inprocess_trials
from tff_comp.tasks import lasso
from tff_comp.tasks import quadratic as tasks_quadratic

DATA = algorithm_cases.DATA['unequal']
IDS = list(DATA.client_ids)
ROUNDS = 3
# Per trial: (seed, client rate, server rate, factor on the rule's other hparams).
TRIALS = ((3, 0.02, 1.0, 1.0), (4, 0.05, 0.5, 1.5), (5, 0.01, 1.2, 0.5))
# Builder arguments that keep every trial's scaled hparams valid (beta <= 1).
ARGUMENTS = {'local_moml': {'beta': 0.5}}


def _plans(said: list[str]) -> list[str]:
  """The lines `run_trials` said of its plans (not of a group's time)."""
  return [line for line in said if 'batched rounds in' not in line]


def _algorithms() -> list[str]:
  return [
    name
    for name in registry.ALGORITHMS.names()
    if not inprocess.why_not(algorithm_cases.algorithm(name, {}))
  ]


def _start(runtime, algorithm, trial):
  _, client_rate, server_rate, factor = trial
  others = {
    k: v * factor
    for k, v in algorithm.client_rule.initial_hparams().items()
    if k != 'learning_rate'
  }
  state = runtime.initialize()
  if 'learning_rate' not in runtime.get_hparams(state)['finalizer']:
    server_rate = 1.0  # a server step without a rate (q-FedAvg's ratio)
  return callbacks.set_learning_rates(runtime, state, client_rate, server_rate, others)


def _rounds(runtime, state, seed):
  """ROUNDS rounds on Poisson cohorts with dropout drawn by `seed`'s sampler."""
  sampler = sampling.ClientSampler(
    IDS, 3, seed, sampling.Participation('poisson', dropout_rate=0.2)
  )
  metrics = []
  for round_num in range(1, ROUNDS + 1):
    clients = sampler.sample(round_num)
    if clients.reporting:
      output = runtime.next(state, list(clients.reporting), clients.work)
      state = output.state
      metrics.append(output.metrics)
  return state, metrics


def _separate(name, engine, extra=None):
  extra = extra or ARGUMENTS.get(name)
  results = []
  for trial in TRIALS:
    algorithm = algorithm_cases.algorithm(name, extra or {}, shuffle=True).with_client_options(
      seed=trial[0]
    )
    runtime = inprocess.build(algorithm, DATA, engine=engine)
    results.append(_rounds(runtime, _start(runtime, algorithm, trial), trial[0]))
  return results


def _batched(name, engine, seeds=None, extra=None):
  extra = extra or ARGUMENTS.get(name)
  algorithm = algorithm_cases.algorithm(name, extra or {}, shuffle=True)
  group = inprocess_trials.TrialGroup(
    inprocess.build(algorithm, DATA, engine=engine), seeds or [t[0] for t in TRIALS]
  )
  results = [None] * len(TRIALS)

  def run(t):
    member = group.member(t)
    try:
      member.reserve_cohort(len(IDS))
      results[t] = _rounds(member, _start(member, algorithm, TRIALS[t]), TRIALS[t][0])
    finally:
      member.leave()

  threads = [threading.Thread(target=run, args=(t,)) for t in range(len(TRIALS))]
  for thread in threads:
    thread.start()
  for thread in threads:
    thread.join()
  return results, group


def _assert_equal(batched, separate, label):
  """Equal to the bit: a trial runs its separate run's ops on its own shapes."""
  for t, ((state, metrics), (want_state, want_metrics)) in enumerate(zip(batched, separate)):
    for a, b in zip(tf.nest.flatten(state), tf.nest.flatten(want_state), strict=True):
      np.testing.assert_array_equal(
        np.asarray(a), np.asarray(b), err_msg=f'{label}, trial {t}: state'
      )
    assert len(metrics) == len(want_metrics), label
    for a, b in zip(tf.nest.flatten(metrics), tf.nest.flatten(want_metrics), strict=True):
      np.testing.assert_array_equal(a, b, err_msg=f'{label}, trial {t}: metrics')


# The representative algorithms by default, every one batchable under make test-slow.
@pytest.mark.parametrize('name', algorithm_cases.each_algorithm(_algorithms()))
def test_each_trial_equals_its_separate_run(name):
  batched, group = _batched(name, 'mapped')
  assert group.rounds_run <= ROUNDS  # the trials' rounds ran together
  assert group.retraces == 0
  _assert_equal(batched, _separate(name, 'mapped'), name)


# Lanes trials by default: test_auto_counts_the_rounds_of_every_trial_sharing_the_build.
@pytest.mark.slow
@pytest.mark.parametrize('name', ['fedavg', 'scaffold'])
def test_each_trial_equals_its_separate_run_on_lanes(name):
  batched, group = _batched(name, 'lanes')
  assert group.retraces == 0  # the kernel compiled once
  _assert_equal(batched, _separate(name, 'lanes'), name)


@pytest.mark.parametrize(
  'spec',
  [
    # dp_adaptive draws dp's noise and more (dp alone: make test-slow)
    pytest.param(privacy.GaussianMean(0.5, 0.8, 3.0), marks=pytest.mark.slow),
    privacy.AdaptiveGaussianMean(0.5, 0.8, 3.0, clipped_count_stddev=0.5),
    # Noise correlated across rounds: the tree's nodes and BandMF's last b - 1 draws
    # kept per trial (make test-slow).
    pytest.param(
      privacy.TreeNoisedMean(0.5, 0.8, 3.0, restart_every=2),
      marks=pytest.mark.slow,
    ),
    pytest.param(
      privacy.BandedNoisedMean(0.5, 0.8, 3.0, strategy=matrix_factorization.optimize(8, 2)),
      marks=pytest.mark.slow,
    ),
  ],
  ids=['dp', 'dp_adaptive', 'dp_ftrl_tree', 'dp_bandmf'],
)
def test_private_trials_each_draw_their_own_noise(spec):
  """DP noise seeded by each trial's seed and round (the tree's and BandMF's carried
  across rounds), adaptive clipping state per trial."""
  extra = dict(model_aggregator=spec, client_weighting='uniform')
  batched, _ = _batched('fedavg', 'mapped', extra=extra)
  _assert_equal(batched, _separate('fedavg', 'mapped', extra), spec.name)


@pytest.mark.slow
def test_trials_sharing_one_seed_are_caught():
  """The mutation check: trials given one seed share shuffles, and differ from their runs."""
  batched, _ = _batched('fedavg', 'mapped', seeds=[3, 3, 3])
  with pytest.raises(AssertionError):
    _assert_equal(batched, _separate('fedavg', 'mapped'), 'fedavg')


def _files(path):
  """metrics.csv without its clock columns, and the final model."""
  columns, rows, _ = outputs.whole_rows(path / 'metrics.csv')
  kept = [c for c in columns if 'seconds' not in c]
  return [[row[c] for c in kept] for row in rows], outputs.load_model(path / 'final_model.npz')


def _assert_same_run(path, want_path) -> Any:
  """Two run directories hold the same metrics.csv rows (clock columns aside) and the
  same final model, bit for bit; returns the model."""
  (rows, model), (want_rows, want_model) = _files(path), _files(want_path)
  assert rows == want_rows, path
  for a, b in zip(tf.nest.flatten(model), tf.nest.flatten(want_model), strict=True):
    np.testing.assert_array_equal(a, b)
  return model


def _grid(root, rows: list[dict], **shared) -> list[trials.Trial]:
  """A trial a row: the `shared` configuration with the row's fields, written to
  root / the row's 'name'; a row's 'hparams' are its client hyperparameters."""
  return [
    trials.Trial(
      ExperimentConfig.of(
        **shared,
        **{k: v for k, v in row.items() if k not in ('name', 'hparams')},
        output_dir=str(root / row['name']),
      ),
      row.get('hparams', {}),
    )
    for row in rows
  ]


def _local_steps(algorithm: str, rounds: int) -> int:
  """The local steps of a run of `rounds` on quadratic, 3 clients a round, as 'auto'
  counts them."""
  prepared = experiment.prepare(
    ExperimentConfig.of(
      algorithm=algorithm,
      task='quadratic',
      rounds=rounds,
      clients_per_round=3,
      engine='mapped',
      output_dir='unused',
    )
  )
  runtime = experiment.build_runner(prepared).runtime
  plan = client_round.plan_cohort(
    runtime.algorithm.client_rule,
    runtime.algorithm.client_options,
    runtime.data.counts,
    runtime.data.keys,
    0,
  )
  return int(rounds * 3 * np.mean(plan.steps.numpy()))


def _alone(trial: trials.Trial):
  """The trial as a run of its own: prepared, built and trained alone."""
  prepared = experiment.prepare(trial.config)
  runner = experiment.build_runner(prepared)
  return experiment.train_runner(
    prepared,
    runner,
    show_progress=False,
    client_hparams=trial.client_hparams,
    learning_rates=(prepared.settings.client_learning_rate, prepared.settings.server_learning_rate),
  )


def test_run_trials_writes_what_each_separate_run_writes(tmp_path):
  """Three FedProx runs of their own rates, mu (through the hparams), seeds and
  participation, batched, against the same three run one after another."""

  def grid(root):
    return _grid(
      root,
      [
        dict(
          name=f'trial_{seed}',
          seed=seed,
          client_learning_rate=rate,
          clients_per_round=cohort,
          hparams={'proximal_strength': mu},
        )
        for seed, rate, mu, cohort in ((1, 0.02, 0.1, 3), (2, 0.05, 0.0, 4), (3, 0.01, 1.0, 2))
      ],
      algorithm='fedprox',
      task='quadratic',
      rounds=4,
      eval_period=2,
      sampling='poisson',
      dropout_rate=0.2,
      engine='mapped',
    )

  said = []
  batched = trials.run_trials(grid(tmp_path / 'batched'), say=said.append)
  assert 'fedprox on quadratic: 3 trials batched into one program' in said[0]
  assert re.fullmatch(
    r'fedprox on quadratic: 3 trials, \d batched rounds in [\d.]+ s; the'
    r' compiled round [\d.]+ s of them \(rounds 2 on\)\.',
    said[1],
  ), said
  separate = [_alone(trial) for trial in grid(tmp_path / 'separate')]
  assert batched == separate
  one_by_one = trials.run_trials(grid(tmp_path / 'one_by_one'), batch=False, say=said.append)
  assert '3 trial(s) one after another (batching off)' in said[2]
  assert one_by_one == separate
  for seed, mu in ((1, 0.1), (2, 0.0), (3, 1.0)):
    _assert_same_run(
      tmp_path / 'batched' / f'trial_{seed}', tmp_path / 'separate' / f'trial_{seed}'
    )
    recorded, alone = (
      json.loads((tmp_path / kind / f'trial_{seed}' / 'config.json').read_text())
      for kind in ('batched', 'separate')
    )
    assert recorded['runtime_record']['trials'] == 3
    assert recorded['runtime_record']['engine'] == alone['runtime_record']['engine']
    assert recorded['resolved']['client_hparams']['proximal_strength'] == mu


def test_auto_counts_the_rounds_of_every_trial_sharing_the_build(tmp_path, monkeypatch):
  """'auto' picks the engine by the local steps a compile serves: three 4-round trials
  batched run on the engine their 12 rounds together take (lanes here), where a 4-round
  run alone takes mapped; each equals its run on that engine. Trials of other lengths
  form groups of their own."""
  monkeypatch.setattr(engines, 'AUTO_LANES_MIN_STEPS', 2 * _local_steps('fedavg', 4))

  def grid(root, rounds=(4, 4, 4), engine='auto'):
    return _grid(
      root,
      [dict(name=f'trial_{seed}', seed=seed, rounds=r) for seed, r in enumerate(rounds)],
      algorithm='fedavg',
      task='quadratic',
      clients_per_round=3,
      eval_period=2,
      engine=engine,
    )

  alone = experiment.build_runner(experiment.prepare(grid(tmp_path / 'alone')[0].config))
  assert alone.runtime.engine == 'mapped' and 'too short' in alone.runtime.why
  said = []
  batched = trials.run_trials(grid(tmp_path / 'batched'), say=said.append)
  assert said[0].startswith('fedavg on quadratic: 3 trials batched into one program')
  assert 'lanes engine' in said[0], said
  assert batched == [_alone(trial) for trial in grid(tmp_path / 'separate', engine='lanes')]
  trials.run_trials(grid(tmp_path / 'lengths', rounds=(4, 4, 20)), say=said.append)
  said = _plans(said)
  assert said[1:] == [
    said[1].split(': ')[0]
    + ': 2 trials batched into one program'
    + said[1].split('one program')[1],
    'fedavg on quadratic: 1 trial(s) one after another (a group of one).',
  ]


@pytest.mark.slow  # data seeds' groups and chunks; each trial's parity runs by default
@pytest.mark.parametrize('name', ['scaffold'])  # FedAvg's path, and per-client rows
def test_trials_on_several_data_seeds_share_a_program_in_chunks(tmp_path, monkeypatch, name):
  """Trials whose tasks differ only in their seed (data and initial MLP: sinewave's)
  run as one group on their tasks' clients together, each equal to its separate run
  (SCAFFOLD: each client's row in its own trial's population); a memory budget of two
  trials splits the three into programs of up to two."""

  def grid(root):
    return _grid(
      root,
      [
        dict(name=f'trial_{seed}_{rate}', seed=seed, client_learning_rate=rate)
        for seed, rate in ((1, 0.01), (2, 0.01), (1, 0.03))
      ],
      algorithm=name,
      task='sinewave',
      rounds=3,
      clients_per_round=3,
      eval_period=3,
      data_seed=None,
    )

  said = []
  monkeypatch.setattr(trials, 'trial_bytes', lambda runtime, clients: 2**20)
  batched = trials.run_trials(grid(tmp_path / 'batched'), say=said.append, memory_budget=2.5)
  said = _plans(said)
  assert said == [
    f'{name} on sinewave: 3 trials batched in 2 programs of up to 2 (about 1.0 MB a trial,'
    " --batch_memory_budget=2.5 MB), on 2 data seeds' clients"
    f' ({said[0].split(" clients (")[1]}'
  ], said
  separate = trials.run_trials(grid(tmp_path / 'separate'), batch=False, say=said.append)
  assert batched == separate
  for name in ('trial_1_0.01', 'trial_2_0.01', 'trial_1_0.03'):
    _assert_same_run(tmp_path / 'batched' / name, tmp_path / 'separate' / name)


def test_a_programs_trials_evaluate_one_at_a_time(tmp_path, monkeypatch):
  """A task's evaluation was not written for threads (a lazily built scorer raced in
  two trials): a program's trials evaluate one at a time."""
  inside = threading.Lock()

  def build(**options):
    task = tasks_quadratic.build_quadratic_task(**options)

    def evaluate(weights, psi):
      assert inside.acquire(blocking=False), 'evaluated by two trials at once'
      try:
        time.sleep(0.02)
        return task.evaluate(weights, psi)
      finally:
        inside.release()

    return dataclasses.replace(task, evaluate=evaluate)

  build.__signature__ = inspect.signature(tasks_quadratic.build_quadratic_task)
  monkeypatch.setattr(registry.TASKS, '_entries', dict(registry.TASKS._entries))
  registry.register_task('quadratic_alone')(build)
  results = trials.run_trials(
    _grid(
      tmp_path,
      [dict(name=str(seed), seed=seed) for seed in range(3)],
      algorithm='fedavg',
      task='quadratic_alone',
      rounds=2,
      eval_period=1,
    ),
    say=lambda _: None,
  )
  assert not [r for r in results if isinstance(r, BaseException)], results


def test_a_programs_trials_evaluate_their_models_together(tmp_path, monkeypatch):
  """On a task that scores several models at once (lasso), a program's trials evaluate
  together, each at its own evaluation rounds (eval_period 1 and 2), and each writes
  the metrics its separate run writes."""
  sizes = []

  def build(**options):
    task = lasso.build_lasso_task(**options)

    def evaluate_many(models):
      sizes.append(len(models))
      return task.evaluate_many(models)

    return dataclasses.replace(task, evaluate_many=evaluate_many)

  build.__signature__ = inspect.signature(lasso.build_lasso_task)
  monkeypatch.setattr(registry.TASKS, '_entries', dict(registry.TASKS._entries))
  registry.register_task('lasso_counted')(build)

  def grid(root):
    return _grid(
      root,
      [
        dict(name=str(seed), seed=seed, client_learning_rate=rate, eval_period=period)
        for seed, rate, period in ((1, 1e-3, 1), (2, 3e-3, 1), (3, 1e-3, 2))
      ],
      algorithm='fedmid',
      task='lasso_counted',
      rounds=2,
      clients_per_round=3,
      engine='mapped',
    )

  batched = trials.run_trials(grid(tmp_path / 'batched'), say=lambda _: None)
  assert sizes == [3, 2, 3]  # rounds 0 and 2 all three trials, round 1 the first two
  sizes.clear()
  separate = [_alone(trial) for trial in grid(tmp_path / 'separate')]
  assert not sizes  # a run of its own scores through evaluate
  assert batched == separate
  for seed in (1, 2, 3):
    assert (
      _files(tmp_path / 'batched' / str(seed))[0] == _files(tmp_path / 'separate' / str(seed))[0]
    )


def test_the_trials_loops_take_turns_between_rounds():
  """Between their rounds a group's trials run their loops one at a time (Python
  threads woken together spent their time handing the GIL to one another), each its
  whole loop, and a trial that ends gives up its turn."""
  algorithm = algorithm_cases.algorithm('fedavg', {})
  group = inprocess_trials.TrialGroup(inprocess.build(algorithm, DATA, engine='mapped'), [1, 2, 3])
  inside, overlaps = threading.Lock(), []

  def run(t):
    member = group.member(t)
    try:
      state = member.initialize()
      for _ in range(3 + t):  # trials end one after another
        state = member.next(state, IDS[:2]).state
        if not inside.acquire(blocking=False):
          overlaps.append(t)
          continue
        time.sleep(0.01)  # another trial's loop would run now
        inside.release()
    finally:
      member.leave()

  # Daemons: a deadlock fails the test instead of holding the suite.
  threads = [threading.Thread(target=run, args=(t,), daemon=True) for t in range(3)]
  for thread in threads:
    thread.start()
  for thread in threads:
    thread.join(timeout=60)
  assert not any(thread.is_alive() for thread in threads)
  assert group.rounds_run == 5 and not overlaps


def test_a_groups_packers_follow_a_changed_structure():
  """The group packs each trial's state by a recipe noted once; a state whose structure
  changed (other hparams, as many) is packed by its own, not into the old names."""
  group = inprocess_trials.TrialGroup(
    inprocess.build(algorithm_cases.algorithm('fedavg', {}), DATA, engine='mapped'), [1]
  )
  before = {'learning_rate': 1.0, 'momentum': 2.0}
  after = {'learning_rate': 1.0, 'proximal_strength': 2.0}
  assert group._packer('hparams', before).pack([5, 6]) == {'learning_rate': 5, 'momentum': 6}
  assert group._packer('hparams', after).pack([5, 6]) == {
    'learning_rate': 5,
    'proximal_strength': 6,
  }


def test_a_diverging_trial_ends_alone_and_the_others_go_on(tmp_path):
  configs = [
    ExperimentConfig.of(
      algorithm='fedavg',
      task='quadratic',
      rounds=5,
      clients_per_round=3,
      eval_period=5,
      client_learning_rate=rate,
      output_dir=str(tmp_path / str(rate)),
    )
    for rate in (0.02, 1e6, 0.05)
  ]
  results = trials.run_trials([trials.Trial(c) for c in configs], say=lambda _: None)
  assert isinstance(results[1], callbacks.DivergenceError)
  for rate, result in ((0.02, results[0]), (0.05, results[2])):
    assert not isinstance(result, Exception)
    rows = outputs.whole_rows(tmp_path / str(rate) / 'metrics.csv')[1]
    assert [row['round'] for row in rows] == ['0', '1', '2', '3', '4', '5']


def test_trials_share_a_build_only_where_one_build_runs_them_all():
  """A trial's local work (batch size, epochs) is in its build; a private trial's noise
  is calibrated to its rounds, cohort and sampling: trials differing in them never
  share a group (a 3-epoch trial once returned the 1-epoch trial's numbers)."""

  def key(**settings):
    settings = dict(dict(algorithm='fedavg', task='lasso', rounds=5, engine='lanes'), **settings)
    return trial_groups.group_key(trial_groups.Trial(ExperimentConfig.of(**settings)))

  assert key(client_learning_rate=0.1, seed=1) == key(client_learning_rate=0.2, seed=2)
  assert key(batch_size=16) != key(batch_size=32)
  assert key(local_epochs=1) != key(local_epochs=3)
  assert key(sampling='uniform') == key(sampling='poisson')
  assert key(rounds=5) == key(rounds=6)
  private = dict(aggregator='dp', clip_norm=1.0, noise_multiplier=0.5)
  assert key(sampling='uniform', **private) != key(sampling='poisson', **private)
  assert key(rounds=5, **private) != key(rounds=6, **private)


@pytest.mark.parametrize(
  'aggregator',
  [  # DP's per-trial noise: test_private_trials_each_draw_their_own_noise
    dict(aggregator='clip'),
    pytest.param(dict(aggregator='dp', noise_multiplier=0.3), marks=pytest.mark.slow),
  ],
)
def test_trials_of_their_own_clip_norm_share_a_build_and_equal_their_runs(tmp_path, aggregator):
  """--clip_norm sets only where a Clip stage's state starts: trials differing in it
  (and in seed) run as one program, batched or one by one, each its separate run."""

  def grid(root):
    return _grid(
      root,
      [
        dict(name=f'trial_{seed}', seed=seed, clip_norm=clip)
        for seed, clip in ((1, 0.05), (2, 0.5), (3, 5.0))
      ],
      algorithm='fedavg',
      task='quadratic',
      rounds=4,
      clients_per_round=3,
      eval_period=2,
      engine='mapped',
      **aggregator,
    )

  assert len(trial_groups.groups(grid(tmp_path))) == 1
  said = []
  batched = trials.run_trials(grid(tmp_path / 'batched'), say=said.append)
  assert 'fedavg on quadratic: 3 trials batched into one program' in said[0], said
  separate = [_alone(trial) for trial in grid(tmp_path / 'separate')]
  assert batched == separate
  assert trials.run_trials(grid(tmp_path / 'one_by_one'), batch=False, say=said.append) == separate
  clipped = []
  for seed in (1, 2, 3):
    want = tmp_path / 'separate' / f'trial_{seed}'
    _assert_same_run(tmp_path / 'batched' / f'trial_{seed}', want)
    assert _files(tmp_path / 'one_by_one' / f'trial_{seed}')[0] == _files(want)[0]
    columns, table, _ = outputs.whole_rows(tmp_path / 'batched' / f'trial_{seed}' / 'metrics.csv')
    clipped.append(float(table[-1]['train/aggregator/clipped_count']))
  assert clipped[0] > clipped[2]  # the trials' clips differed


@pytest.mark.parametrize(
  'shared, own',
  [
    (
      dict(aggregator='trimmed_mean', attack='scaled'),
      [
        dict(trim_fraction=0.0, attack_fraction=0.2, attack_scale=2.0),
        dict(trim_fraction=0.2, attack_fraction=0.4, attack_scale=2.0),
        dict(trim_fraction=0.4, attack_fraction=0.4, attack_scale=5.0),
      ],
    ),
    # Each stage's own state, as the trimmed mean's and the attack's (make test-slow).
    pytest.param(
      dict(aggregator='multi_krum'),
      # f up to 1 on 5 clients (Krum's m >= 2f + 3); the rows averaged also in the state.
      [
        dict(byzantine_clients=0),
        dict(byzantine_clients=1),
        dict(byzantine_clients=1, multi_krum_select=2),
      ],
      marks=pytest.mark.slow,
    ),
    pytest.param(
      dict(aggregator='centered_clip'),
      [dict(centered_clip_tau=t) for t in (0.01, 0.1, 1.0)],
      marks=pytest.mark.slow,
    ),
  ],
  ids=['trimmed_mean_attacked', 'multi_krum', 'centered_clip'],
)
def test_trials_of_their_own_aggregator_settings_share_a_build_and_equal_their_runs(
  tmp_path, shared, own
):
  """A trimmed mean's fraction, Krum's f (and Multi-Krum's m - f rows), centered
  clipping's radius and the attackers' fraction and scale are their stages' states:
  trials differing in them run as one program, each its separate run."""

  def grid(root):
    return _grid(
      root,
      [dict(name=f'trial_{k}', **settings) for k, settings in enumerate(own)],
      algorithm='fedavg',
      task='quadratic',
      rounds=3,
      clients_per_round=5,
      eval_period=3,
      seed=1,
      engine='mapped',
      **shared,
    )

  assert len(trial_groups.groups(grid(tmp_path))) == 1
  said = []
  batched = trials.run_trials(grid(tmp_path / 'batched'), say=said.append)
  assert 'fedavg on quadratic: 3 trials batched into one program' in said[0], said
  assert batched == [_alone(trial) for trial in grid(tmp_path / 'separate')]
  models = []
  for k in range(3):
    model = _assert_same_run(
      tmp_path / 'batched' / f'trial_{k}', tmp_path / 'separate' / f'trial_{k}'
    )
    models.append(np.concatenate([np.ravel(a) for a in tf.nest.flatten(model)]))
  # One seed: the trials differ by their settings alone.
  assert not np.array_equal(models[0], models[1]) and not np.array_equal(models[1], models[2])


def test_trials_on_several_data_seeds_start_from_their_own_chains():
  """A program over several tasks' clients starts each trial from its own task's model
  and its own chain (two trials of one task took the first's clip before)."""
  prepared = trials._prepare(
    [
      ExperimentConfig.of(
        algorithm='fedavg',
        task='sinewave',
        aggregator='clip',
        clip_norm=clip,
        seed=seed,
        data_seed=None,
        rounds=2,
        engine='mapped',
      )
      for seed, clip in ((1, 0.5), (2, 0.5), (1, 2.0))
    ]
  )
  program = trials._build([0, 1, 2], prepared)
  clips = [float(state.aggregator.chain.stages[0]) for state in program.initial]
  assert clips == [0.5, 0.5, 2.0]
  models = [tf.nest.flatten(state.global_model_weights)[0] for state in program.initial]
  np.testing.assert_array_equal(models[0], models[2])
  assert not np.array_equal(models[0], models[1])


def test_a_short_grid_over_data_seeds_on_a_large_population_runs_resident(tmp_path, monkeypatch):
  """Trials of several data seeds share a program over their tasks' clients merged,
  whose dataset function takes Python ids: a run of fewer client-rounds than that
  population streamed it and traced back (SymbolicTensor has no 'partition'); it stays
  resident, each trial its separate run."""
  monkeypatch.setattr(inprocess, 'STREAM_SHORT_RUNS_FROM', 4)

  def grid(root):
    return _grid(
      root,
      [dict(name=f'trial_{seed}', seed=seed) for seed in (1, 2)],
      algorithm='fedavg',
      task='quadratic',
      rounds=2,
      clients_per_round=2,
      eval_period=2,
      data_seed=None,
      engine='mapped',
    )

  said = []
  batched = trials.run_trials(grid(tmp_path / 'batched'), say=said.append)
  assert 'batched into one program' in said[0], said
  assert batched == [_alone(trial) for trial in grid(tmp_path / 'separate')]


def test_label_flipping_trials_of_other_fractions_never_share_a_group():
  """Label flipping poisons the task's data by --attack_fraction: not a chain's state."""

  def key(**settings):
    config = ExperimentConfig.of(algorithm='fedavg', task='emnist', rounds=2, **settings)
    return trial_groups.group_key(trial_groups.Trial(config))

  assert key(attack='sign_flip', attack_fraction=0.1) == key(
    attack='sign_flip', attack_fraction=0.3
  )
  assert key(attack='label_flip', attack_fraction=0.1) != key(
    attack='label_flip', attack_fraction=0.3
  )


def test_trials_whose_chains_differ_beyond_their_states_get_a_build_each(monkeypatch):
  """A secure sum's modulus is sized to the cohort (a per-trial setting) and is in its
  program: trials of other cohorts are built apart, the others share a build."""
  prepared = [
    experiment.prepare(
      ExperimentConfig.of(
        algorithm='fedavg',
        task='quadratic',
        secure_aggregation=True,
        clients_per_round=m,
        seed=s,
        rounds=2,
        engine='mapped',
      )
    )
    for s, m in ((1, 3), (2, 6), (3, 3))
  ]
  builds = []
  monkeypatch.setattr(trials, '_build', lambda members, ps: builds.append(members) or members)
  runner = experiment.Runner(None, None, '', algorithm=prepared[0].build())
  program = trials._Program([10, 11, 12], prepared, runner)
  assert trials._by_chain_start(program) == [[10, 12], [11]] == builds


def test_trials_run_one_by_one_each_shuffle_with_their_own_seed(tmp_path):
  """A build's compiled round holds its seed (shuffling, epoch draws, the aggregator's
  draws): trials of other seeds run one by one on builds of their own (the second
  trial took the first's shuffling before)."""

  def grid(root):
    return _grid(
      root,
      [dict(name=f'trial_{seed}', seed=seed) for seed in (1, 2)],
      algorithm='fedavg',
      task='lasso',
      rounds=3,
      clients_per_round=3,
      eval_period=3,
      shuffle=True,
      engine='mapped',
    )

  said = []
  one_by_one = trials.run_trials(grid(tmp_path / 'one_by_one'), batch=False, say=said.append)
  assert 'fedavg on lasso: one build per seed (2), whose compiled round' in said[1], said
  assert one_by_one == [_alone(trial) for trial in grid(tmp_path / 'separate')]


def test_a_tff_process_gets_a_build_per_clip_norm(monkeypatch):
  """A TFF process bakes --clip_norm into its factories, as TFF's runtime does an
  Algorithm's: trials differing in it are built apart; on a runtime with the
  `StartsChains` capability an Algorithm's trials share a build, each starting from its
  own (`_own_chain_start`)."""
  prepared = [
    experiment.prepare(
      ExperimentConfig.of(
        algorithm='fedavg', task='quadratic', aggregator='clip', clip_norm=c, seed=s, rounds=2
      )
    )
    for s, c in ((1, 0.5), (2, 1.0), (3, 0.5))
  ]
  builds = []
  monkeypatch.setattr(trials, '_build', lambda members, ps: builds.append(members) or members)
  process = trials._Program([10, 11, 12], prepared, experiment.Runner(None, None, 'a process'))
  assert trials._by_chain_start(process) == [[10, 12], [11]] == builds

  class Starts:
    def starting_chain_at(self, chain_state):
      del chain_state
      return self

  builds.clear()
  for runtime, want in ((Starts(), None), (object(), [[10, 12], [11]])):
    algorithm = process._replace(runner=experiment.Runner(runtime, None, '', algorithm=object()))
    assert trials._by_chain_start(algorithm) == (want or [algorithm])
  assert builds == [[10, 12], [11]]
