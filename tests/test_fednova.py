"""FedNova: ||a_i||_1 from trajectories, the aggregator, heterogeneous local work, and the
objective-inconsistency closed forms on `quadratic`."""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tests import algorithm_cases
from tff_comp import data as data_lib
from tff_comp import experiment, models
from tff_comp.learning_process import aggregation_factories
from tff_comp.ops import local_loop, messages, model_ops, sgd, update_aggregation
from tff_comp.ops import rule as rule_lib
from tff_comp.runtime import inprocess
from tff_comp.tasks import quadratic

D = 5
RNG = np.random.default_rng(0)
RNG_SEED = 100  # each test's draws restart here (tests/conftest.py)
X = RNG.normal(size=(23, D)).astype(np.float32)
Y = (X @ RNG.normal(size=D)).astype(np.float32)


@pytest.mark.parametrize('momentum,mu', [(0.0, 0.0), (0.9, 0.0), (0.0, 2.0)])
def test_a_norm_matches_the_recorded_trajectory(momentum, mu):
  """Delta = eta sum_k a_k g_k with the recorded gradients g_k, and ||a||_1 reported."""
  model = models.linear_regression((D,))
  lr = 0.05
  base = sgd.SGD(model, learning_rate=lr, momentum=momentum, proximal_strength=mu)
  rule = sgd.NormalizedSGD(base)
  hparams = collections.OrderedDict((k, tf.constant(v)) for k, v in rule.initial_hparams().items())
  payload = tff.learning.models.ModelWeights((tf.zeros([D]), tf.zeros([])), ())
  context = rule_lib.RoundContext.of()
  state = rule.initialize(payload, hparams, context)
  grads = []
  for start in range(0, 20, 4):  # 5 steps of batch 4
    batch = (X[start : start + 4], Y[start : start + 4])
    _, g = model_ops.batch_loss_and_gradient(model, state.weights, (), batch)
    grads.append(g[0].numpy())  # the loss gradient at the current iterate
    state = rule.step(state, batch, payload, hparams, context)
  update = rule.finalize(state, payload, hparams, context)
  tau = len(grads)
  if momentum:
    a = np.array([(1 - momentum ** (tau - k)) / (1 - momentum) for k in range(tau)])
  elif mu:
    a = np.array([(1 - lr * mu) ** (tau - 1 - k) for k in range(tau)])
  else:
    a = np.ones(tau)
  np.testing.assert_allclose(update.delta[0], lr * np.array(grads).T @ a, rtol=1e-4, atol=1e-6)
  assert float(update.a_norm) == pytest.approx(a.sum(), rel=1e-5)


def test_fednova_aggregator_on_its_own():
  value_type = tff.types.tensorflow_to_type(
    messages.NormalizedUpdate(
      delta=(tf.TensorSpec([2], tf.float32),), a_norm=tf.TensorSpec([], tf.float32)
    )
  )
  process = aggregation_factories.factory_for(update_aggregation.NORMALIZED).create(
    value_type, tff.TensorType(np.float32)
  )
  deltas = [np.array([1.0, 2.0]), np.array([-3.0, 0.5]), np.array([0.2, 0.2])]
  norms, weights = [2.0, 6.0, 1.0], [10.0, 30.0, 60.0]
  out = process.next(
    process.initialize(),
    [
      messages.NormalizedUpdate((d.astype(np.float32),), np.float32(a))
      for d, a in zip(deltas, norms)
    ],
    [np.float32(w) for w in weights],
  )
  p = np.array(weights) / sum(weights)
  tau_eff = p @ np.array(norms)
  want = tau_eff * sum(pi * d / a for pi, d, a in zip(p, deltas, norms))
  np.testing.assert_allclose(out.result[0], want, rtol=1e-6)
  assert out.measurements['tau_eff'] == pytest.approx(tau_eff)


def test_drawn_epochs_are_reproducible_and_vary():
  def draws(seed, round_num):
    return [
      int(
        local_loop.draw_epochs(
          local_loop.client_key((X[i : i + 5], Y[i : i + 5])), seed, round_num, 2, 5
        )
      )
      for i in range(0, 20, 5)
    ]

  assert draws(0, 3) == draws(0, 3)
  seen = {e for r in range(10) for e in draws(0, r)}
  assert seen == {2, 3, 4, 5}
  assert draws(0, 1) != draws(0, 2)  # another round, other draws
  assert draws(0, 1) != draws(1, 1)  # another seed, other draws


def _quadratic_run(algorithm, tmp_path, eta, rounds=100):
  prepared = experiment.prepare(
    experiment.ExperimentConfig.of(
      algorithm=algorithm,
      task='quadratic',
      rounds=rounds,
      eval_period=rounds,
      client_learning_rate=eta,
      server_learning_rate=2.0,
      output_dir=str(tmp_path / algorithm),
    )
  )
  task = prepared.task
  process = inprocess.build(prepared.build_process(), task.train_data)
  state = process.initialize()
  for _ in range(rounds):  # full participation, as in the closed form
    state = process.next(state, task.train_data.client_ids).state
  return process.get_model_weights(state).trainable[0]


def test_quadratic_fixed_points_match_closed_forms(tmp_path):
  eta = 0.005
  task = quadratic.build_quadratic_task()
  centers = np.random.default_rng(0).normal(size=(6, 4))
  steps = np.array([1, 2, 5, 10, 20, 40])
  optimum = (steps / steps.sum()) @ centers
  fedavg_x = _quadratic_run('fedavg', tmp_path, eta)
  fednova_x = _quadratic_run('fednova', tmp_path, eta)
  np.testing.assert_allclose(
    fedavg_x, quadratic.fixed_point(centers, steps, eta, normalized=False), atol=1e-4
  )
  np.testing.assert_allclose(
    fednova_x, quadratic.fixed_point(centers, steps, eta, normalized=True), atol=1e-4
  )
  fedavg_gap = np.linalg.norm(fedavg_x - optimum)
  fednova_gap = np.linalg.norm(fednova_x - optimum)
  assert fednova_gap * 10 <= fedavg_gap
  assert task.evaluate((fednova_x,))['distance_to_optimum'] == pytest.approx(fednova_gap, rel=1e-4)


# FedAvg and FedProx draw in the same local loop (make test-slow).
@pytest.mark.parametrize(
  'name', [pytest.param(n, marks=pytest.mark.slow) for n in ('fedavg', 'fedprox')] + ['fednova']
)
def test_drawn_epochs_set_each_clients_steps(name):
  """With epochs drawn from U{2..5}, client i takes floor(E_i n_i / B) steps (FedNova's
  tau_i), for the three algorithms that draw them."""
  data = algorithm_cases.DATA['unequal']
  arrays = data_lib.client_arrays(data)
  ids = ['c0', 'c1', 'c2', 'c3', 'c4']
  process = inprocess.build(
    algorithm_cases.build(name, dict(local_epochs=2, local_epochs_max=5, seed=3, batch_size=4)),
    data,
  )
  state, drawn = process.initialize(), set()
  for round_num in range(2):
    want = 0
    for i, count in enumerate(arrays.counts):
      start = int(arrays.counts[:i].sum())
      examples = tuple(tf.constant(a[start : start + count]) for a in arrays.examples)
      epochs = int(local_loop.draw_epochs(local_loop.client_key(examples), 3, round_num, 2, 5))
      drawn.add(epochs)
      want += epochs * int(count) // 4
    out = process.next(state, ids)
    state = out.state
    assert float(out.metrics['client_work']['num_steps']) == want, name
  assert len(drawn) > 1  # the epochs did vary
