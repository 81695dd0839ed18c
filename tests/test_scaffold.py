"""SCAFFOLD against a NumPy implementation of the paper's option II, two rounds with
partial participation, on both runtimes; and what its control variates do."""

import numpy as np
import pytest
import tensorflow as tf

from tests import numpy_reference as ref
from tff_comp import models
from tff_comp.algorithms import scaffold
from tff_comp.runtime import choice
from tff_comp.tasks import array_data

D, LR, SERVER_LR, BATCH = 4, 0.05, 0.8, 4
ROUNDS = (['c', 'a'], ['b', 'c'])  # client 'b' first seen in round 2; 'a' not in round 2


def _clients():
  return ref.shifted_clients(11, ((9, 0.0), (6, 2.0), (8, -1.0)), D)


def _numpy_scaffold(clients):
  """x = (w, b), server control c and client controls c_i after ROUNDS, in NumPy."""
  x = [np.zeros(D), 0.0]
  c = [np.zeros(D), 0.0]
  ci = [[np.zeros(D), 0.0] for _ in clients]
  for sampled in ROUNDS:
    dys, dcs = [], []
    for name in sampled:
      i = 'abc'.index(name)
      xi, yi = clients[i]
      y = [x[0].copy(), x[1]]
      k = 0
      for xb, yb in ref.batches(xi, yi, BATCH):
        g = ref.gradient(y[0], y[1], xb, yb)
        y = [y[j] - LR * (g[j] + c[j] - ci[i][j]) for j in range(2)]
        k += 1
      new_ci = [ci[i][j] - c[j] + (x[j] - y[j]) / (k * LR) for j in range(2)]
      dys.append([y[j] - x[j] for j in range(2)])
      dcs.append([new_ci[j] - ci[i][j] for j in range(2)])
      ci[i] = new_ci
    x = [x[j] + SERVER_LR * np.mean([d[j] for d in dys], axis=0) for j in range(2)]
    c = [c[j] + np.sum([d[j] for d in dcs], axis=0) / len(clients) for j in range(2)]
  return x, c, ci


@pytest.mark.parametrize('runtime', ['inprocess', 'tff'])
def test_two_rounds_with_partial_participation_match_numpy(tmp_path, monkeypatch, runtime):
  monkeypatch.setenv('TFF_COMP_DATA_DIR', str(tmp_path))
  clients = _clients()
  data = array_data.cached_client_data(
    'scaffold-test', ['a', 'b', 'c'], (D,), tf.float32, lambda i: clients[i]
  )
  algorithm = scaffold.scaffold(
    models.linear_regression((D,)),
    num_clients=3,
    client_learning_rate=LR,
    server_learning_rate=SERVER_LR,
    batch_size=BATCH,
  ).with_client_options(shuffle=False)
  run, _ = choice.runner_for(algorithm, data, runtime)
  state = run.initialize()
  controls_after_round_1 = None
  for sampled in ROUNDS:
    state = run.next(state, sampled).state
    if controls_after_round_1 is None:
      controls_after_round_1 = [np.array(t) for t in state.finalizer.controls]

  x, c, ci = _numpy_scaffold(clients)
  got = run.get_model_weights(state).trainable
  np.testing.assert_allclose(got[0], x[0], rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(got[1], x[1], rtol=1e-4, atol=1e-5)
  server = state.finalizer
  np.testing.assert_allclose(server.control[0], c[0], rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(server.control[1], c[1], rtol=1e-4, atol=1e-5)
  for i in range(3):
    np.testing.assert_allclose(server.controls[0][i], ci[i][0], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(server.controls[1][i], ci[i][1], rtol=1e-4, atol=1e-5)
  # Client 'a' was not sampled in round 2: its control variate is unchanged.
  np.testing.assert_array_equal(np.asarray(server.controls[0][0]), controls_after_round_1[0][0])
  assert np.abs(controls_after_round_1[0][0]).max() > 1e-3  # it had moved in round 1
  assert np.abs(c[0]).max() > 1e-3  # the comparison is not between zero controls


def test_control_variates_remove_client_drift():
  """With full participation and exact gradients (each local step on all of a client's
  6 examples), SCAFFOLD's fixed point is the optimum of mean_i F_i: it converges to the
  least-squares solution, while FedAvg's 10 local steps drift toward the clients' own
  optima (Karimireddy et al., section 5)."""
  clients = [(x[:6], y[:6]) for x, y in _clients()]
  data = array_data.cached_client_data(
    'scaffold-drift', ['a', 'b', 'c'], (D,), tf.float32, lambda i: clients[i]
  )
  x = np.concatenate([np.c_[c[0], np.ones(len(c[1]))] for c in clients])
  y = np.concatenate([c[1] for c in clients])
  # Uniform weights over clients: the optimum of mean_i F_i (each F_i a mean loss).
  weights = np.concatenate([np.full(len(c[1]), 1 / len(c[1])) for c in clients])
  optimum = np.linalg.solve(x.T @ (weights[:, None] * x), x.T @ (weights * y))
  common = dict(
    client_learning_rate=0.02, batch_size=6, local_epochs=10, client_weighting='uniform'
  )
  model = models.linear_regression((D,))
  distances = {}
  from tff_comp.algorithms import fedavg

  for name, algorithm in (
    ('scaffold', scaffold.scaffold(model, num_clients=3, **common)),
    ('fedavg', fedavg.fedavg(model, **common)),
  ):
    run, _ = choice.runner_for(algorithm, data, 'inprocess')
    state = run.initialize()
    for _ in range(150):
      state = run.next(state, ['a', 'b', 'c']).state
    w, b = run.get_model_weights(state).trainable
    distances[name] = np.linalg.norm(np.r_[w, b] - optimum)
  assert distances['scaffold'] < 1e-3 < 0.01 < distances['fedavg'], distances
