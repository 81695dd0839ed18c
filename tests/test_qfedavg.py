"""q-FedAvg: q = 0 is uniform FedAvg; q = 1 matches a hand computation."""

import numpy as np
import tensorflow as tf

from tests import algorithm_cases
from tests import numpy_reference as ref
from tff_comp import models
from tff_comp.algorithms import fedavg, qfedavg

D, LR, BATCH = 5, 0.05, 4


def _clients():
  rng = np.random.default_rng(11)
  out = []
  for n, shift in ((8, 0.0), (12, 1.0), (6, -0.5)):
    x = (rng.normal(size=(n, D)) + shift).astype(np.float32)
    out.append((x, (x @ rng.normal(size=D) + 2 * shift).astype(np.float32)))
  return out


def _datasets(clients):
  return [tf.data.Dataset.from_tensor_slices(c) for c in clients]


def test_q_zero_is_uniform_fedavg():
  model = models.linear_regression((D,))
  q_process = qfedavg.build_qfedavg(model, client_learning_rate=LR, q=0.0, batch_size=BATCH)
  plain = fedavg.build_fedavg(
    model, client_learning_rate=LR, batch_size=BATCH, client_weighting='uniform'
  )
  a, b = q_process.initialize(), plain.initialize()
  for _ in range(3):
    a = q_process.next(a, _datasets(_clients())).state
    b = plain.next(b, _datasets(_clients())).state
  for x, y in zip(q_process.get_model_weights(a).trainable, plain.get_model_weights(b).trainable):
    np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)


def test_q_one_round_matches_hand_computation():
  q = 1.0
  process = algorithm_cases.stored_order(
    qfedavg.qfedavg(models.linear_regression((D,)), client_learning_rate=LR, q=q, batch_size=BATCH)
  )
  clients = _clients()
  w = process.get_model_weights(process.next(process.initialize(), _datasets(clients)).state)
  deltas, hs = [], []
  for x, y in clients:
    f = 0.5 * np.mean((x @ np.zeros(D) - y) ** 2)
    cw, cb = np.zeros(D), 0.0
    for xb, yb in ref.batches(x, y, BATCH):
      gw, gb = ref.gradient(cw, cb, xb, yb)
      cw, cb = cw - LR * gw, cb - LR * gb
    dw, db = -cw / LR, -cb / LR
    deltas.append((f**q * dw, f**q * db))
    hs.append(q * f ** (q - 1) * (dw @ dw + db * db) + f**q / LR)
  want_w = -sum(d[0] for d in deltas) / sum(hs)
  want_b = -sum(d[1] for d in deltas) / sum(hs)
  np.testing.assert_allclose(w.trainable[0], want_w, rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(w.trainable[1], want_b, rtol=1e-4, atol=1e-6)
