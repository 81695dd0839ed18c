"""FedAvg's `client_momentum`: heavy-ball local SGD (reset every round) against NumPy,
two rounds with partial participation, on both runtimes; and its flag."""

import numpy as np
import pytest
import tensorflow as tf

from tests import numpy_reference as ref
from tff_comp import models, registry
from tff_comp.algorithms import fedavg
from tff_comp.runtime import choice
from tff_comp.tasks import array_data

D, LR, RHO, SERVER_LR, BATCH = 4, 0.05, 0.9, 0.8, 4
ROUNDS = (['c', 'a'], ['b', 'c'])


def _numpy_fedavg_with_momentum(clients):
  """(w, b) after ROUNDS: v <- rho v + g, w <- w - eta v per batch, v = 0 every round;
  the server steps along the example-weighted mean delta."""
  x = [np.zeros(D), 0.0]
  for sampled in ROUNDS:
    deltas, weights = [], []
    for name in sampled:
      xi, yi = clients['abc'.index(name)]
      y, v = [x[0].copy(), x[1]], [np.zeros(D), 0.0]
      for xb, yb in ref.batches(xi, yi, BATCH):
        g = ref.gradient(y[0], y[1], xb, yb)
        v = [RHO * v[j] + g[j] for j in range(2)]
        y = [y[j] - LR * v[j] for j in range(2)]
      deltas.append([y[j] - x[j] for j in range(2)])
      weights.append(len(yi))
    w = np.array(weights, float) / sum(weights)
    x = [x[j] + SERVER_LR * sum(wi * d[j] for wi, d in zip(w, deltas)) for j in range(2)]
  return x


@pytest.mark.parametrize('runtime', ['inprocess', 'tff'])
def test_client_momentum_matches_heavy_ball_local_sgd_in_numpy(tmp_path, monkeypatch, runtime):
  monkeypatch.setenv('TFF_COMP_DATA_DIR', str(tmp_path))
  clients = ref.shifted_clients(11, ((9, 0.0), (6, 2.0), (8, -1.0)), D)
  data = array_data.cached_client_data(
    'momentum-test', ['a', 'b', 'c'], (D,), tf.float32, lambda i: clients[i]
  )
  algorithm = fedavg.fedavg(
    models.linear_regression((D,)),
    client_learning_rate=LR,
    client_momentum=RHO,
    server_learning_rate=SERVER_LR,
    batch_size=BATCH,
  ).with_client_options(shuffle=False)
  run, _ = choice.runner_for(algorithm, data, runtime)
  state = run.initialize()
  for sampled in ROUNDS:
    state = run.next(state, sampled).state
  want = _numpy_fedavg_with_momentum(clients)
  got = run.get_model_weights(state).trainable
  np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(got[1], want[1], rtol=1e-4, atol=1e-5)


def test_client_momentum_is_an_option_of_fedavg_and_a_negative_one_is_refused():
  """Builder options become flags of the same name (`binaries/flags_lib.py`)."""
  assert 'client_momentum' in {h.name for h in registry.get_algorithm('fedavg').hparams}
  with pytest.raises(ValueError, match='client_momentum'):
    fedavg.fedavg(models.linear_regression((D,)), client_learning_rate=LR, client_momentum=-0.5)
