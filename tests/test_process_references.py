"""Whole processes against independent NumPy implementations of their update rules
(linear regression, loss 0.5 mean squared error: its gradient is affine and its Hessian
constant, so MAML's meta-gradients have closed forms). Several rounds, clients of
unequal sizes, on the in-process runtime (equal to the TFF process: test_inprocess)."""

import numpy as np
import pytest

from tests import algorithm_cases
from tests import numpy_reference as ref
from tff_comp import data as data_lib
from tff_comp.ops import regularizers
from tff_comp.runtime import inprocess

DATA = algorithm_cases.DATA['unequal']
ARRAYS = data_lib.client_arrays(DATA)
ROUNDS = [['c0', 'c2', 'c4'], ['c1', 'c3', 'c4'], ['c0', 'c1', 'c3']]
B, K, LR = 3, 4, 0.05


def _client(cid):
  i = ARRAYS.client_ids.index(cid)
  start = int(ARRAYS.counts[:i].sum())
  x, y = (np.asarray(a)[start : start + ARRAYS.counts[i]] for a in ARRAYS.examples)
  return x.astype(np.float64), y.astype(np.float64)


def _hvp(x, v):
  """The (constant) Hessian of the loss on x times v = (vw, vb)."""
  r = x @ v[0] + v[1]
  return x.T @ r / len(r), np.mean(r)


def _loss(w, x, y):
  return 0.5 * np.mean((x @ w[0] + w[1] - y) ** 2)


def _sub(a, b, scale=1.0):
  return a[0] - scale * b[0], a[1] - scale * b[1]


def _cycled_batches(x, y, size, steps):
  """Step k's batch: examples k*size .. (k+1)*size - 1, wrapping around (local_steps)."""
  for k in range(steps):
    index = np.arange(k * size, (k + 1) * size) % len(y)
    yield x[index], y[index]


def _run(name, extra, rounds=ROUNDS):
  process = inprocess.build(algorithm_cases.build(name, extra), DATA)
  state, states = process.initialize(), []
  for ids in rounds:
    states.append(state)
    state = process.next(state, ids).state
  states.append(state)
  return process, states


def _weights(process, state):
  w, b = process.get_model_weights(state).trainable
  return np.asarray(w, np.float64), float(b)


def _close(got, want, tol=1e-5):
  np.testing.assert_allclose(got[0], want[0], rtol=tol, atol=tol)
  assert got[1] == pytest.approx(want[1], rel=tol, abs=tol)


def _maml_direction(w, d, d_test, d_hessian, alpha, variant):
  adapted = _sub(w, ref.gradient(*w, *d), alpha)
  outer = ref.gradient(*adapted, *d_test)
  if variant == 'fo':
    return outer
  return _sub(outer, _hvp(d_hessian[0], outer), alpha)


def _per_fedavg_client(w, cid, alpha, variant):
  x, y = _client(cid)
  for bx, by in _cycled_batches(x, y, 3 * B, K):
    thirds = [(bx[j * B : (j + 1) * B], by[j * B : (j + 1) * B]) for j in range(3)]
    w = _sub(w, _maml_direction(w, *thirds, alpha, variant), LR)
  return w


@pytest.mark.parametrize('variant', ['fo', 'exact', 'hf'])
def test_per_fedavg(variant):
  alpha = 0.1
  process, states = _run('per_fedavg', dict(variant=variant, alpha=alpha, client_learning_rate=LR))
  w = _weights(process, states[0])
  for ids in ROUNDS:
    ends = [_per_fedavg_client(w, cid, alpha, variant) for cid in ids]
    w = (np.mean([e[0] for e in ends], 0), np.mean([e[1] for e in ends]))
  # hf: central differences of an affine gradient are exact up to float32 rounding.
  _close(_weights(process, states[-1]), w, tol=1e-5 if variant != 'hf' else 2e-3)


def test_tr_maml_model_and_task_weight_updates():
  alpha, eg_rate = 0.1, 0.5
  process, states = _run(
    'tr_maml', dict(alpha=alpha, client_learning_rate=LR, task_weight_learning_rate=eg_rate)
  )
  w = _weights(process, states[0])
  lam = np.full(5, 0.2)
  for r, ids in enumerate(ROUNDS):
    np.testing.assert_allclose(states[r].finalizer.client_weights, lam, rtol=1e-5)
    losses = np.zeros(5)
    for cid in ids:  # the post-adaptation loss on all the client's examples at w_r
      x, y = _client(cid)
      losses[ARRAYS.client_ids.index(cid)] = _loss(_sub(w, ref.gradient(*w, x, y), alpha), x, y)
    ends = [_per_fedavg_client(w, cid, alpha, 'fo') for cid in ids]
    weights = np.array([lam[ARRAYS.client_ids.index(c)] for c in ids])
    w = tuple(
      w[j] + sum(p * (e[j] - w[j]) for p, e in zip(weights, ends)) / weights.sum() for j in range(2)
    )
    lam = lam * np.exp(eg_rate * losses)
    lam /= lam.sum()
  _close(_weights(process, states[-1]), w)
  np.testing.assert_allclose(states[-1].finalizer.client_weights, lam, rtol=1e-5)


@pytest.mark.parametrize('objective', ['maml', 'da_maml'])
def test_comfedl_with_meta_learning_objectives(objective):
  alpha, gamma = 0.1, 2.0
  process, states = _run(
    'comfedl',
    dict(objective=objective, inner_learning_rate=alpha, gamma=gamma, client_learning_rate=LR),
  )
  w = _weights(process, states[0])
  for ids in ROUNDS:
    reference = 0.0
    if objective == 'da_maml':  # c: the largest adapted full-data loss of the round
      reference = max(
        _loss(_sub(w, ref.gradient(*w, *_client(c)), alpha), *_client(c)) for c in ids
      )
    ends = []
    for cid in ids:
      v = w
      for bx, by in _cycled_batches(*_client(cid), 2 * B, K):
        train, test = (bx[:B], by[:B]), (bx[B:], by[B:])
        direction = _maml_direction(v, train, test, train, alpha, 'exact')
        if objective == 'da_maml':
          adapted = _sub(v, ref.gradient(*v, *train), alpha)
          scale = np.exp((_loss(adapted, *test) - reference) / gamma) / gamma
          direction = (scale * direction[0], scale * direction[1])
        v = _sub(v, direction, LR)
      ends.append(v)
    w = (np.mean([e[0] for e in ends], 0), np.mean([e[1] for e in ends]))
  _close(_weights(process, states[-1]), w)


def test_fedavg_subgradient_with_an_l1_regularizer():
  lam = 0.3
  process, states = _run(
    'fedavg_subgrad', dict(regularizer=regularizers.L1(strength=lam), client_learning_rate=LR)
  )
  w = _weights(process, states[0])
  for ids in ROUNDS:
    ends = []
    for cid in ids:
      v = w
      for bx, by in ref.batches(*_client(cid), B):
        gw, gb = ref.gradient(*v, bx, by)
        v = (v[0] - LR * (gw + lam * np.sign(v[0])), v[1] - LR * gb)
      ends.append(v)
    w = (np.mean([e[0] for e in ends], 0), np.mean([e[1] for e in ends]))
  assert np.count_nonzero(w[0]) == len(w[0])  # the subgradient was not zero
  _close(_weights(process, states[-1]), w)


def test_fednova_with_server_momentum():
  lr_s, beta = 0.7, 0.9
  process, states = _run(
    'fednova', dict(server_learning_rate=lr_s, server_momentum=beta, client_learning_rate=LR)
  )
  w = _weights(process, states[0])
  momentum = (np.zeros_like(w[0]), 0.0)
  for ids in ROUNDS:
    deltas, taus, sizes = [], [], []
    for cid in ids:
      x, y = _client(cid)
      v, tau = w, 0
      for bx, by in ref.batches(x, y, B):
        v = _sub(v, ref.gradient(*v, bx, by), LR)
        tau += 1
      deltas.append(_sub(w, v))
      taus.append(tau)
      sizes.append(len(y))
    p = np.array(sizes) / sum(sizes)
    tau_eff = p @ np.array(taus)
    update = tuple(
      tau_eff * sum(pi * d[j] / t for pi, d, t in zip(p, deltas, taus)) for j in range(2)
    )
    momentum = (beta * momentum[0] + update[0], beta * momentum[1] + update[1])
    w = _sub(w, momentum, lr_s)
  _close(_weights(process, states[-1]), w)


@pytest.mark.parametrize('objective', ['maml', 'da_maml'])
def test_local_scgdm_with_meta_learning_objectives(objective):
  """Trackers: u of the adapted model y = w - alpha grad L(w; D_train), momentum m of
  J^T grad g(u); the server averages x, u and m. DA-MAML's m is re-expressed in each
  round's reference c by exp((c_old - c_new) / gamma)."""
  alpha, gamma, eta = 0.1, 2.0, LR
  a_m, beta, g_t = 2.0, 0.5, 3.0  # momentum rate, step scale, tracking rate
  process, states = _run(
    'local_scgdm',
    dict(
      objective=objective,
      inner_learning_rate=alpha,
      gamma=gamma,
      client_learning_rate=eta,
      momentum_rate=a_m,
      beta=beta,
      tracking_gamma=g_t,
    ),
  )
  w = _weights(process, states[0])
  u, m, c_old, started = None, None, 0.0, False
  for ids in ROUNDS:
    c = 0.0
    if objective == 'da_maml':
      c = max(_loss(_sub(w, ref.gradient(*w, *_client(i)), alpha), *_client(i)) for i in ids)
    scale = np.exp((c_old - c) / gamma) if objective == 'da_maml' and started else 1.0
    ends = []
    for cid in ids:
      x, cu, first = w, u, not started
      cm = None if m is None else (scale * m[0], scale * m[1])
      for bx, by in _cycled_batches(*_client(cid), 2 * B, K):
        train, test = (bx[:B], by[:B]), (bx[B:], by[B:])
        value = _sub(x, ref.gradient(*x, *train), alpha)
        cu = (
          value if first else tuple((1 - g_t * eta) * o + g_t * eta * n for o, n in zip(cu, value))
        )
        grad_g = ref.gradient(*cu, *test)
        if objective == 'da_maml':
          factor = np.exp((_loss(cu, *test) - c) / gamma) / gamma
          grad_g = (factor * grad_g[0], factor * grad_g[1])
        z = _sub(grad_g, _hvp(train[0], grad_g), alpha)
        cm = z if first else tuple((1 - a_m * eta) * o + a_m * eta * n for o, n in zip(cm, z))
        x = _sub(x, cm, beta * eta)
        first = False
      ends.append((x, cu, cm))

    def mean(j):
      return tuple(np.mean([e[j][k] for e in ends], 0) for k in range(2))  # noqa: B023 (called in this iteration)

    w, u, m, c_old, started = mean(0), mean(1), mean(2), c, True
  _close(_weights(process, states[-1]), w)
  np.testing.assert_allclose(states[-1].finalizer.m[0], m[0], rtol=1e-4, atol=1e-5)
