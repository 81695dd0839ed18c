"""Local-MOML against an independent NumPy implementation of its rule (the module
docstring of `tff_comp.algorithms.local_moml`, `../shared/algorithms.md`) on linear
regression, whose gradient and Hessian are closed forms: two rounds of partial
participation, both variants, memory kept across rounds or re-set each round. A client
sampled in round 1 only keeps its memory through round 2; one never sampled holds none."""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_comp import models, registry
from tff_comp.runtime import inprocess

DIM, BATCH, STEPS = 3, 2, 3
ALPHA, BETA, ETA, SERVER = 0.1, 0.7, 0.05, 1.5
ROUNDS = (('0', '1'), ('1', '2'))  # client 0 in round 1 only, client 3 never


def _clients() -> dict[str, tuple[np.ndarray, np.ndarray]]:
  rng = np.random.default_rng(4)
  clients = {}
  for i, n in enumerate((7, 10, 5, 8)):
    x = rng.normal(size=(n, DIM)).astype(np.float32) + i
    clients[str(i)] = (x, (x @ np.array([1.0, -2.0, 0.5]) + 0.3 * i).astype(np.float32))
  return clients


def _gradient(w, b, x, y):
  r = x @ w + b - y
  return x.T @ r / len(y), np.mean(r)


def _hessian_times(x, vw, vb):
  """H (vw, vb) of 0.5 mean((x w + b - y)^2) in (w, b)."""
  s = x @ vw + vb
  return x.T @ s / len(s), np.mean(s)


def _reference(variant: str, persistent: bool):
  """(w, b, {client: memory}) after `ROUNDS`, by the rule as written."""
  clients = _clients()
  w, b, memory = np.zeros(DIM), 0.0, {}
  for cohort in ROUNDS:
    deltas = []
    for cid in cohort:
      x, y = (a.astype(np.float64) for a in clients[cid])
      wi, bi = w.copy(), b
      u = memory.get(cid) if persistent else None
      for k in range(STEPS):
        idx = [(2 * BATCH * k + j) % len(y) for j in range(2 * BATCH)]
        tr, val = idx[:BATCH], idx[BATCH:]
        gw, gb = _gradient(wi, bi, x[tr], y[tr])
        adapted = (wi - ALPHA * gw, bi - ALPHA * gb)
        u = adapted if u is None else u
        v = (BETA * adapted[0] + (1 - BETA) * u[0], BETA * adapted[1] + (1 - BETA) * u[1])
        ow, ob = _gradient(*v, x[val], y[val])
        if variant == 'exact':
          hw, hb = _hessian_times(x[tr], ow, ob)
          ow, ob = BETA * (ow - ALPHA * hw), BETA * (ob - ALPHA * hb)
        u = v
        wi, bi = wi - ETA * ow, bi - ETA * ob
      memory[cid] = u
      deltas.append((w - wi, b - bi))
    w = w - SERVER * np.mean([d[0] for d in deltas], axis=0)
    b = b - SERVER * np.mean([d[1] for d in deltas])
  return w, b, memory


@pytest.mark.parametrize('memory', ['persistent', 'round'])
@pytest.mark.parametrize('variant', ['exact', 'fo'])
def test_local_moml_is_its_rule(variant, memory):
  algorithm = (
    registry.get_algorithm('local_moml')
    .build(
      models.linear_regression((DIM,)),
      num_clients=4,
      client_learning_rate=ETA,
      alpha=ALPHA,
      beta=BETA,
      variant=variant,
      memory=memory,
      local_steps=STEPS,
      batch_size=BATCH,
      server_learning_rate=SERVER,
    )
    .with_client_options(shuffle=False)
  )
  data = tff.simulation.datasets.TestClientData(_clients())
  runtime = inprocess.build(algorithm, data, engine='mapped')
  state = runtime.initialize()
  after = []
  for cohort in ROUNDS:
    state = runtime.next(state, list(cohort)).state
    after.append(state)
  w, b, memories = _reference(variant, memory == 'persistent')
  kernel, bias = runtime.get_model_weights(state).trainable
  np.testing.assert_allclose(kernel, w, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(bias, b, rtol=1e-5, atol=1e-5)
  if memory == 'round':
    return
  table = np.asarray(after[-1].finalizer.memory[0])
  seen = np.asarray(after[-1].finalizer.seen)
  np.testing.assert_array_equal(seen, [1, 1, 1, 0])
  for cid in ('0', '1', '2'):
    np.testing.assert_allclose(table[int(cid)], memories[cid][0], rtol=1e-5, atol=1e-5)
  assert not np.any(table[3])  # never sampled: no memory
  # Client 0, sampled in round 1 only, kept its memory through round 2.
  np.testing.assert_array_equal(table[0], np.asarray(after[0].finalizer.memory[0])[0])


def test_beta_one_without_memory_is_a_maml_step():
  """beta = 1 ignores the memory: v = w - alpha grad f(w; D_tr), a MAML step, so the two
  memory placements give the same model."""

  def model_after(memory):
    algorithm = (
      registry.get_algorithm('local_moml')
      .build(
        models.linear_regression((DIM,)),
        num_clients=4,
        client_learning_rate=ETA,
        alpha=ALPHA,
        beta=1.0,
        memory=memory,
        local_steps=STEPS,
        batch_size=BATCH,
      )
      .with_client_options(shuffle=False)
    )
    runtime = inprocess.build(
      algorithm, tff.simulation.datasets.TestClientData(_clients()), engine='mapped'
    )
    state = runtime.initialize()
    for cohort in ROUNDS:
      state = runtime.next(state, list(cohort)).state
    return tf.nest.flatten(runtime.get_model_weights(state).trainable)

  for a, b in zip(model_after('persistent'), model_after('round')):
    np.testing.assert_allclose(a, b, rtol=1e-6)
