"""Client sampling and availability: the sampler's draws, rounds where nobody reports,
stragglers against a NumPy FedNova, clients drawn twice against TFF's process, and the
flags that choose them."""

import csv
import json

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tests import algorithm_cases, numpy_reference
from tff_comp import experiment
from tff_comp.ops import local_loop
from tff_comp.run import sampling, training_loop
from tff_comp.runtime import inprocess, tff_process

IDS = [f'c{i}' for i in range(100)]
DATA = algorithm_cases.DATA['unequal']


def _sampler(k=10, **participation):
  return sampling.ClientSampler(
    IDS, k, seed=4, participation=sampling.Participation(**participation)
  )


def test_uniform_draws_distinct_clients_the_same_in_every_run():
  sampler = _sampler()
  draws = [sampler.sample(r) for r in range(1, 51)]
  assert all(
    len(set(d.sampled)) == 10 and d.reporting == d.sampled and d.work is None for d in draws
  )
  assert len({d.sampled for d in draws}) == 50  # a new cohort every round
  # A function of (seed, round): drawing round 7 alone gives round 7 of the run.
  assert _sampler().sample(7) == draws[6]
  assert sampler.capacity == 10


def test_a_rounds_draw_is_its_seeds_and_rounds_in_any_order():
  """Rounds drawn ahead (`sampling.AHEAD` at a time) or alone, in any order: round r's
  clients are NumPy's draw from the generator seeded by (seed, r)."""
  sampler = _sampler()
  for r in (40, 3, 1, 35, 2, 33, 100):
    want = np.random.default_rng([4, r]).choice(len(IDS), 10, replace=False)
    assert sampler.sample(r).sampled == tuple(IDS[i] for i in want), r


def test_with_replacement_draws_some_client_twice():
  draws = [_sampler(k=30, sampling='with_replacement').sample(r) for r in range(1, 21)]
  assert all(len(d.sampled) == 30 for d in draws)
  assert any(len(set(d.sampled)) < 30 for d in draws)


def test_poisson_cohorts_vary_around_k_within_the_capacity():
  sampler = _sampler(sampling='poisson')
  sizes = np.array([len(sampler.sample(r).sampled) for r in range(1, 2001)])
  assert len(set(sizes)) > 5
  # Binomial(100, 0.1): mean 10, variance 9.
  assert sizes.mean() == pytest.approx(10, abs=0.3)
  assert sizes.var() == pytest.approx(9, rel=0.15)
  assert sizes.max() <= sampler.capacity < 100


def test_poisson_includes_each_client_independently_with_probability_k_over_n():
  """What DP accounting assumes: each client is in a round independently with
  q = k / N. On 4 clients with k = 2, q = 0.5 (k / (N + 1) would give 0.4; the mean
  cohort of the test above cannot tell them apart), and two clients are in a round
  together with probability q^2 (a uniform draw of 2 of 4 gives 1/6)."""
  sampler = sampling.ClientSampler(
    IDS[:4], 2, seed=4, participation=sampling.Participation('poisson')
  )
  drawn = np.array([[c in sampler.sample(r).sampled for c in IDS[:4]] for r in range(1, 4001)])
  np.testing.assert_allclose(drawn.mean(axis=0), 0.5, atol=0.03)
  np.testing.assert_allclose((drawn[:, 0] & drawn[:, 1]).mean(), 0.25, atol=0.03)


def test_dropout_and_stragglers_at_their_rates():
  sampler = _sampler(dropout_rate=0.3, straggler_rate=0.25, straggler_work=0.4)
  draws = [sampler.sample(r) for r in range(1, 1001)]
  reporting = sum(len(d.reporting) for d in draws)
  assert reporting / 10_000 == pytest.approx(0.7, abs=0.02)
  assert all(set(d.reporting) <= set(d.sampled) for d in draws)
  works = [w for d in draws for w in (d.work or [1.0] * len(d.reporting))]
  assert len(works) == reporting and set(works) == {0.4, 1.0}
  assert works.count(0.4) / reporting == pytest.approx(0.25, abs=0.02)
  assert draws[0].metrics() == {
    'participation/sampled': 10.0,
    'participation/reporting': float(len(draws[0].reporting)),
    'participation/straggling': float(sum(w < 1 for w in draws[0].work or ())),
  }


@pytest.mark.parametrize(
  'bad,match',
  [
    (dict(sampling='stratified'), 'sampling'),
    (dict(dropout_rate=1.0), 'dropout_rate'),
    (dict(straggler_rate=-0.1), 'straggler_rate'),
    (dict(straggler_work=0.0), 'straggler_work'),
  ],
)
def test_bad_participation_is_refused(bad, match):
  with pytest.raises(ValueError, match=match):
    sampling.Participation(**bad)


def test_limit_keeps_a_prefix_of_at_least_one_step():
  batches = local_loop.BatchPlan(
    tf.constant([4, 4, 0, 1, 0]), tf.constant([2, 0, 3, 0, 0]), tf.zeros([5], tf.int64)
  )
  cut = local_loop.limit(batches, tf.constant([0.5, 0.5, 0.2, 1.0, 0.9]))
  # 5 steps (4 full + short) -> 2; 4 -> 2; 1 short -> at least 1; whole; none stays none.
  assert cut.full.numpy().tolist() == [2, 2, 0, 1, 0]
  assert cut.remainder.numpy().tolist() == [0, 0, 3, 0, 0]
  whole = local_loop.limit(batches, tf.ones([5]))
  assert whole.steps.numpy().tolist() == batches.steps.numpy().tolist()


def _numpy_fednova(w, b, clients, steps, *, lr, batch_size):
  """FedNova with plain local SGD: client i takes its first steps[i] batches in stored
  order; d_i = Delta_i / tau_i; update tau_eff sum_i p_i d_i, p_i = n_i / n."""
  n = np.array([len(y) for _, y in clients], np.float64)
  p = n / n.sum()
  tau_eff = float(np.sum(p * steps))
  dw, db = np.zeros_like(w), 0.0
  for (x, y), tau, p_i in zip(clients, steps, p, strict=True):
    cw, cb = w.copy(), b
    for k, (xb, yb) in enumerate(numpy_reference.batches(x, y, batch_size)):
      if k == tau:
        break
      gw, gb = numpy_reference.gradient(cw, cb, xb, yb)
      cw, cb = cw - lr * gw, cb - lr * gb
    dw += p_i * (cw - w) / tau
    db += p_i * (cb - b) / tau
  return w + tau_eff * dw, b + tau_eff * db


def test_stragglers_do_part_of_their_steps_and_fednova_normalizes_by_them():
  """FedNova with stragglers (half their steps) against NumPy: a_i counts the steps a
  straggler did, so its update is not mistaken for a small one."""
  lr = 0.05
  algorithm = algorithm_cases.algorithm('fednova', dict(client_learning_rate=lr))
  runtime = inprocess.build(algorithm, DATA, engine='lanes', lanes=2)
  ids = list(DATA.client_ids)
  work = [0.5, 1.0, 0.5, 1.0, 0.3]
  out = runtime.next(runtime.initialize(), ids, work)
  clients = [
    tuple(np.asarray(t) for t in local_loop.materialize(DATA.create_tf_dataset_for_client(c)))
    for c in ids
  ]
  full = np.array([int(np.ceil(len(y) / 3)) for _, y in clients])  # batch size 3
  steps = np.maximum(1, np.floor(np.array(work) * full)).astype(int)
  assert out.metrics['client_work']['num_steps'] == steps.sum() < full.sum()
  w, b = _numpy_fednova(np.zeros(algorithm_cases.D), 0.0, clients, steps, lr=lr, batch_size=3)
  got = runtime.get_model_weights(out.state).trainable
  np.testing.assert_allclose(got[0], w, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(got[1], b, rtol=1e-5, atol=1e-6)
  assert float(out.metrics['aggregator']['tau_eff']) == pytest.approx(
    np.sum(steps * [len(y) for _, y in clients]) / sum(len(y) for _, y in clients)
  )


def test_a_client_drawn_twice_trains_twice_as_in_tffs_process():
  process = algorithm_cases.build('fedavg', {}, shuffle=True)
  fast = inprocess.build(process, DATA, engine='lanes', lanes=2)
  slow = tff.simulation.compose_dataset_computation_with_learning_process(
    tff_process.dataset_computation_for(process, DATA), process
  )
  ids = ['c1', 'c3', 'c1']
  fast_out, slow_out = fast.next(fast.initialize(), ids), slow.next(slow.initialize(), ids)
  for a, b in zip(
    fast.get_model_weights(fast_out.state).trainable,
    process.get_model_weights(slow_out.state).trainable,
    strict=True,
  ):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  assert fast_out.metrics['client_work']['num_examples'] == 12 + 5 + 12


class _NobodyOnRoundsOneAndTwo(sampling.ClientSampler):
  def sample(self, round_num):
    drawn = super().sample(round_num)
    return drawn._replace(reporting=()) if round_num in (1, 2) else drawn


def test_a_round_nobody_reports_leaves_the_model_unchanged_and_is_logged(
  tmp_path, caplog, monkeypatch
):
  """A sampler of one's own (here: nobody reports in rounds 1 and 2) given to the loop."""
  prepared = experiment.prepare(
    experiment.ExperimentConfig.of(
      algorithm='fedavg', task='quadratic', rounds=4, eval_period=1, output_dir=str(tmp_path)
    )
  )
  runner = experiment.build_runner(prepared)
  seen = []
  next_round = runner.runtime.next
  monkeypatch.setattr(
    runner.runtime,
    'next',
    lambda state, ids, work=None: seen.append(len(ids)) or next_round(state, ids, work),
  )
  training_loop.run_simulation(
    runner.runtime,
    client_ids=prepared.task.train_data.client_ids,
    rounds=4,
    clients_per_round=6,
    seed=0,
    output_dir=tmp_path,
    config={},
    callbacks=training_loop.standard_callbacks(runner.evaluate, eval_period=1, show_progress=False),
    show_progress=False,
    sampler=_NobodyOnRoundsOneAndTwo(prepared.task.train_data.client_ids, 6, 0),
  )
  assert len(seen) == 2  # rounds 3 and 4 only
  assert 'round 1: none of the' in caplog.text and 'round 2: none of the' in caplog.text
  with open(tmp_path / 'metrics.csv', newline='') as f:
    rows = list(csv.DictReader(f))
  assert [r['round'] for r in rows] == ['0', '1', '2', '3', '4']
  # The model did not move in rounds 1-2: their evaluations equal round 0's.
  assert rows[1]['eval/objective'] == rows[2]['eval/objective'] == rows[0]['eval/objective']
  assert rows[3]['eval/objective'] != rows[0]['eval/objective']
  assert rows[1]['participation/reporting'] == '0.0'
  assert rows[1]['train/client_work/train_loss'] == ''  # columns from round 3's row
  assert rows[3]['train/client_work/train_loss'] != ''


def test_participation_flags_reach_config_json_and_bad_ones_are_one_line(tmp_path):
  config = experiment.ExperimentConfig.of(
    algorithm='fedavg',
    task='quadratic',
    rounds=2,
    output_dir=str(tmp_path),
    sampling='poisson',
    dropout_rate=0.2,
    straggler_rate=0.1,
    straggler_work=0.25,
  )
  prepared = experiment.prepare(config)
  experiment.train_runner(prepared, experiment.build_runner(prepared), show_progress=False)
  recorded = json.loads((tmp_path / 'config.json').read_text())
  assert [
    recorded['participation'][k]
    for k in ('sampling', 'dropout_rate', 'straggler_rate', 'straggler_work')
  ] == ['poisson', 0.2, 0.1, 0.25]
  with pytest.raises(experiment.ConfigError, match=r'^--dropout_rate must be in \[0, 1\)'):
    experiment.prepare(
      experiment.ExperimentConfig.of(
        algorithm='fedavg', task='quadratic', dropout_rate=1.5, output_dir=str(tmp_path / 'b')
      )
    )
  with pytest.raises(experiment.ConfigError, match='keeps a table entry per client'):
    experiment.build_runner(
      experiment.prepare(
        experiment.ExperimentConfig.of(
          algorithm='ditto', sampling='with_replacement', output_dir=str(tmp_path / 'c')
        )
      )
    )
  with pytest.raises(experiment.ConfigError, match='in-process|--runtime=inprocess'):
    experiment.build_runner(
      experiment.prepare(
        experiment.ExperimentConfig.of(
          algorithm='fedavg',
          task='quadratic',
          runtime='tff',
          straggler_rate=0.2,
          output_dir=str(tmp_path / 'd'),
        )
      )
    )


def test_auto_compiles_lanes_only_for_runs_long_enough_to_repay_it():
  algorithm = algorithm_cases.algorithm('fedavg', {})
  short = inprocess.build(algorithm, DATA, client_rounds=30)
  assert short.engine == 'mapped' and 'too short' in short.why
  long = inprocess.build(algorithm, DATA, client_rounds=10**6)
  assert long.engine == 'lanes' and not long.why
  assert inprocess.build(algorithm, DATA).engine == 'lanes'  # length unknown


def test_fedavg_round_against_numpy_weights_clients_by_examples_and_reports_the_loss():
  """One FedAvg round on clients of unequal sizes, against NumPy (not another runtime
  sharing the math): the update is the example-weighted mean of the client deltas and
  `train_loss` the example-weighted mean batch loss at the visited iterates."""
  lr = 0.05
  runtime = inprocess.build(
    algorithm_cases.algorithm('fedavg', dict(client_learning_rate=lr)),
    DATA,
    engine='lanes',
    lanes=2,
  )
  ids = list(DATA.client_ids)
  out = runtime.next(runtime.initialize(), ids)
  clients = [
    tuple(np.asarray(t) for t in local_loop.materialize(DATA.create_tf_dataset_for_client(c)))
    for c in ids
  ]
  w0, b0 = np.zeros(algorithm_cases.D), 0.0
  deltas, loss_sum, n = [], 0.0, []
  for x, y in clients:
    w, b = w0.copy(), b0
    for xb, yb in numpy_reference.batches(x, y, 3):
      loss_sum += 0.5 * np.sum((xb @ w + b - yb) ** 2)  # batch mean x batch size
      gw, gb = numpy_reference.gradient(w, b, xb, yb)
      w, b = w - lr * gw, b - lr * gb
    deltas.append((w - w0, b - b0))
    n.append(len(y))
  p = np.array(n) / sum(n)
  assert len(set(n)) > 1  # unequal sizes: uniform weights would differ
  got = runtime.get_model_weights(out.state).trainable
  np.testing.assert_allclose(
    got[0], w0 + sum(pi * d[0] for pi, d in zip(p, deltas)), rtol=1e-5, atol=1e-6
  )
  np.testing.assert_allclose(
    got[1], b0 + sum(pi * d[1] for pi, d in zip(p, deltas)), rtol=1e-5, atol=1e-6
  )
  assert float(out.metrics['client_work']['train_loss']) == pytest.approx(
    loss_sum / sum(n), rel=1e-5
  )


@pytest.mark.parametrize(
  'name', ['fedavg', 'fednova', pytest.param('feddualavg', marks=pytest.mark.slow)]
)
def test_a_cohort_of_total_weight_zero_leaves_the_model_unchanged_on_both_runtimes(name):
  """Clients without examples weigh 0: the cohort's mean update is 0, not 0 / 0."""
  data = algorithm_cases.client_data([0, 0, 6], 'empty')
  process = algorithm_cases.build(name, {})
  fast = inprocess.build(process, data, engine='lanes', lanes=2)
  slow = tff.simulation.compose_dataset_computation_with_learning_process(
    tff_process.dataset_computation_for(process, data), process
  )
  fast_out = fast.next(fast.initialize(), ['c0', 'c1'])
  slow_out = slow.next(slow.initialize(), ['c0', 'c1'])
  initial = process.get_model_weights(slow.initialize()).trainable
  for weights in (
    fast.get_model_weights(fast_out.state).trainable,
    process.get_model_weights(slow_out.state).trainable,
  ):
    for a, b in zip(weights, initial, strict=True):
      np.testing.assert_array_equal(a, b)
  assert float(fast_out.metrics['client_work']['train_loss']) == 0.0
