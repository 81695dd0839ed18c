"""FedMiD / FedDualAvg (and -OSP) processes against the NumPy reference, several rounds,
clients of unequal sizes (so elapsed learning-rate sums differ)."""

import numpy as np
import pytest
import tensorflow as tf

from tests import algorithm_cases
from tests import numpy_reference as ref
from tff_comp import models
from tff_comp.algorithms import fedavg, feddualavg, fedmid
from tff_comp.ops import regularizers

D, BATCH, LAM, LR_C, LR_S = 10, 4, 0.3, 0.05, 2.0
SIZES = (9, 16, 5, 12)


def _clients():
  rng = np.random.default_rng(5)
  w = np.zeros(D)
  w[:3] = 1.5
  out = []
  for n in SIZES:
    x = (rng.normal(size=(n, D)) + rng.normal(size=D)).astype(np.float32)
    out.append((x, (x @ w + 1.0 + 0.1 * rng.normal(size=n)).astype(np.float32)))
  return out


def _run(process, clients, rounds=4):
  state = process.initialize()
  datasets = [tf.data.Dataset.from_tensor_slices(c) for c in clients]
  for r in range(rounds):
    state = process.next(state, [datasets[(r + i) % len(datasets)] for i in range(3)]).state
  return process.get_model_weights(state).trainable, state


def _rounds(clients, rounds=4):
  for r in range(rounds):
    yield [clients[(r + i) % len(clients)] for i in range(3)]


@pytest.mark.parametrize('client_prox', [True, False])
def test_fedmid_matches_reference(client_prox):
  process = algorithm_cases.stored_order(
    fedmid.fedmid(
      models.linear_regression((D,)),
      regularizer=regularizers.L1(strength=LAM),
      client_learning_rate=LR_C,
      server_learning_rate=LR_S,
      batch_size=BATCH,
      client_prox=client_prox,
    )
  )
  clients = _clients()
  (w, b), _ = _run(process, clients)
  rw, rb = np.zeros(D), 0.0
  for chosen in _rounds(clients):
    rw, rb = ref.fedmid_round(
      rw, rb, chosen, lr_c=LR_C, lr_s=LR_S, lam=LAM, batch_size=BATCH, client_prox=client_prox
    )
  np.testing.assert_allclose(w, rw, atol=2e-5)
  np.testing.assert_allclose(b, rb, atol=2e-5)
  assert np.count_nonzero(rw) < D  # the prox is active in this test


@pytest.mark.parametrize('client_prox', [True, False])
def test_feddualavg_matches_reference(client_prox):
  process = algorithm_cases.stored_order(
    feddualavg.feddualavg(
      models.linear_regression((D,)),
      regularizer=regularizers.L1(strength=LAM),
      client_learning_rate=LR_C,
      server_learning_rate=LR_S,
      batch_size=BATCH,
      client_prox=client_prox,
    )
  )
  clients = _clients()
  (w, b), state = _run(process, clients)
  z, zb, elapsed = np.zeros(D), 0.0, 0.0
  for chosen in _rounds(clients):
    z, zb, elapsed, rw, rb = ref.feddualavg_round(
      z,
      zb,
      elapsed,
      chosen,
      lr_c=LR_C,
      lr_s=LR_S,
      lam=LAM,
      batch_size=BATCH,
      client_prox=client_prox,
    )
  np.testing.assert_allclose(w, rw, atol=2e-5)
  np.testing.assert_allclose(b, rb, atol=2e-5)
  np.testing.assert_allclose(state.finalizer.dual[0], z, atol=2e-5)
  assert state.finalizer.elapsed == pytest.approx(elapsed, rel=1e-5)
  assert 0 < np.count_nonzero(rw) < D


@pytest.mark.parametrize(
  'build', [fedmid.build_fedmid, feddualavg.build_feddualavg, fedavg.build_fedavg_subgradient]
)
def test_zero_regularizer_reduces_to_fedavg(build):
  model = models.linear_regression((D,))
  args = dict(
    client_learning_rate=LR_C,
    server_learning_rate=LR_S,
    batch_size=BATCH,
    client_weighting='uniform',
  )
  composite = build(model, regularizer=regularizers.NoRegularizer(), **args)
  plain = fedavg.build_fedavg(model, **args)
  clients = _clients()
  got, _ = _run(composite, clients)
  want, _ = _run(plain, clients)
  for a, b in zip(got, want):
    np.testing.assert_allclose(a, b, atol=1e-5)
