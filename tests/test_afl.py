"""AFL: simplex projection, lambda ascent and lambda-weighted averaging vs NumPy."""

import numpy as np
import pytest
from scipy import optimize
import tensorflow as tf
import tensorflow_federated as tff

from tests import algorithm_cases
from tests import numpy_reference as ref
from tff_comp import models
from tff_comp.algorithms import afl
from tff_comp.learning_process import client_work
from tff_comp.ops import server_steps
from tff_comp.tasks import array_data

D, LR, LAMBDA_LR, BATCH = 4, 0.05, 0.5, 5


@pytest.mark.parametrize('seed', [0, 1, 2])
def test_project_simplex_matches_constrained_minimization(seed):
  v = np.random.default_rng(seed).normal(size=6) * 2
  got = server_steps.project_simplex(tf.constant(v, tf.float32)).numpy()
  res = optimize.minimize(
    lambda w: 0.5 * np.sum((w - v) ** 2),
    np.full(6, 1 / 6),
    method='SLSQP',
    bounds=[(0, None)] * 6,
    constraints=[dict(type='eq', fun=lambda w: w.sum() - 1)],
    options=dict(ftol=1e-14),
  )
  np.testing.assert_allclose(got, res.x, atol=1e-4)
  assert got.sum() == pytest.approx(1.0, abs=1e-6)


def _clients():
  return ref.shifted_clients(4, ((10, 0.0), (5, 2.0), (8, -1.0)), D)


def test_two_rounds_match_numpy(tmp_path, monkeypatch):
  monkeypatch.setenv('TFF_COMP_DATA_DIR', str(tmp_path))
  clients = _clients()
  data = array_data.cached_client_data(
    'afl-test', ['a', 'b', 'c'], (D,), tf.float32, lambda i: clients[i]
  )
  process = algorithm_cases.stored_order(
    afl.afl(
      models.linear_regression((D,)),
      num_clients=3,
      client_learning_rate=LR,
      lambda_learning_rate=LAMBDA_LR,
      batch_size=BATCH,
    )
  )
  process = tff.simulation.compose_dataset_computation_with_learning_process(
    client_work.indexed_dataset_computation(data), process
  )
  state = process.initialize()
  for _ in range(2):  # clients in another order than their indices
    state = process.next(state, ['c', 'a', 'b']).state

  w, b, lam = np.zeros(D), 0.0, np.full(3, 1 / 3)
  for _ in range(2):
    deltas, losses = [], []
    for x, y in clients:
      losses.append(0.5 * np.mean((x @ w + b - y) ** 2))
      cw, cb = w.copy(), b
      for xb, yb in ref.batches(x, y, BATCH):
        gw, gb = ref.gradient(cw, cb, xb, yb)
        cw, cb = cw - LR * gw, cb - LR * gb
      deltas.append((cw - w, cb - b))
    w = w + sum(l * d[0] for l, d in zip(lam, deltas)) / lam.sum()
    b = b + sum(l * d[1] for l, d in zip(lam, deltas)) / lam.sum()
    lam = server_steps.project_simplex(
      tf.constant(lam + LAMBDA_LR * np.array(losses), tf.float32)
    ).numpy()
  got = process.get_model_weights(state).trainable
  np.testing.assert_allclose(got[0], w, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(got[1], b, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(state.finalizer.client_weights, lam, atol=1e-5)
  assert lam.max() > 0.5  # lambda moved toward the worst client


def test_tr_maml_task_weights_follow_exponentiated_gradient(tmp_path, monkeypatch):
  from tff_comp.algorithms import tr_maml
  from tff_comp.ops import model_ops

  monkeypatch.setenv('TFF_COMP_DATA_DIR', str(tmp_path))
  clients = _clients()
  data = array_data.cached_client_data(
    'trmaml-test', ['a', 'b', 'c'], (D,), tf.float32, lambda i: clients[i]
  )
  model = models.linear_regression((D,))
  process = tff.simulation.compose_dataset_computation_with_learning_process(
    client_work.indexed_dataset_computation(data),
    tr_maml.build_tr_maml(
      model,
      num_clients=3,
      client_learning_rate=0.01,
      alpha=0.02,
      task_weight_learning_rate=0.3,
      local_steps=2,
      batch_size=3,
    ),
  )
  state = process.next(process.initialize(), ['b', 'c', 'a']).state
  zero = (tf.zeros([D]), tf.constant(0.0))
  losses = []
  for x, y in clients:
    batch = (tf.constant(x), tf.constant(y))
    _, grads = model_ops.batch_loss_and_gradient(model, zero, (), batch)
    adapted = tuple(w - 0.02 * g for w, g in zip(zero, grads))
    losses.append(float(model_ops.batch_loss(model, adapted, (), batch)))
  want = np.exp(0.3 * np.array(losses)) / np.exp(0.3 * np.array(losses)).sum()
  np.testing.assert_allclose(state.finalizer.client_weights, want, rtol=1e-5)
  # The hardest task gains weight from the uniform start.
  assert state.finalizer.client_weights[np.argmax(losses)] > 1 / 3
