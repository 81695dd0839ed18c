"""`local_steps` of local SGD (FedAvg, FedProx, SCAFFOLD): exactly K steps of B examples
a client, cycling through its examples, against NumPy; refused beside drawn epochs."""

import numpy as np
import pytest

from tests import algorithm_cases
from tff_comp import registry
from tff_comp.runtime import inprocess

DATA = algorithm_cases.DATA['unequal']
K, B, LR = 4, 3, 0.02


def _numpy_round(w, b, clients, *, mu: float = 0.0):
  """One round of FedAvg (FedProx's mu (w - w_r) added) with uniform weights and eta_s
  1: each client K steps on positions [k B, (k + 1) B) of its examples, modulo n."""
  deltas = []
  for x, y in clients:
    wk, bk = w.copy(), b
    for k in range(K):
      idx = [(k * B + j) % len(y) for j in range(B)]
      r = x[idx] @ wk + bk - y[idx]
      gw, gb = x[idx].T @ r / B + mu * (wk - w), np.mean(r) + mu * (bk - b)
      wk, bk = wk - LR * gw, bk - LR * gb
    deltas.append((wk - w, bk - b))
  return w + np.mean([d[0] for d in deltas], 0), b + np.mean([d[1] for d in deltas])


@pytest.mark.parametrize('name, extra', [('fedavg', {}), ('fedprox', {'mu': 0.5})])
def test_each_client_takes_k_steps_cycling_through_its_examples(name, extra):
  algorithm = algorithm_cases.algorithm(
    name,
    dict(
      extra,
      client_learning_rate=LR,
      batch_size=B,
      local_steps=K,
      client_weighting='uniform',
    ),
  )
  runtime = inprocess.build(algorithm, DATA, engine='mapped')
  state = runtime.initialize()
  ids = list(DATA.client_ids)
  output = runtime.next(state, ids)
  clients = [
    tuple(
      np.stack([np.asarray(e[i]) for e in DATA.create_tf_dataset_for_client(c)]) for i in (0, 1)
    )
    for c in ids
  ]
  w0, b0 = (np.asarray(v) for v in runtime.get_model_weights(state).trainable)
  w, b = _numpy_round(w0, b0, clients, mu=extra.get('mu', 0.0))
  got = runtime.get_model_weights(output.state).trainable
  np.testing.assert_allclose(np.asarray(got[0]), w, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(np.asarray(got[1]), b, rtol=1e-5, atol=1e-6)
  assert float(output.metrics['client_work']['num_steps']) == K * len(ids), output.metrics


def test_fixed_steps_beside_drawn_epochs_is_refused_in_one_line():
  with pytest.raises(ValueError, match='local_steps fixes .* local_epochs_max draws them'):
    registry.get_algorithm('fedavg').build(
      algorithm_cases.MODEL, client_learning_rate=0.1, local_steps=3, local_epochs_max=4
    )
