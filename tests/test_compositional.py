"""The compositional client block and ComFedL with the DRFL objective."""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tests import algorithm_cases
from tests import numpy_reference as ref
from tff_comp import models
from tff_comp.algorithms import comfedl, fedavg
from tff_comp.ops import model_ops, objectives

D = 6
RNG = np.random.default_rng(7)
RNG_SEED = 107  # each test's draws restart here (tests/conftest.py)
MODEL = models.linear_regression((D,))


def _batch(n=15, shift=0.0, rng=RNG):
  x = (rng.normal(size=(n, D)) + shift).astype(np.float32)
  return x, (x @ rng.normal(size=D) + shift).astype(np.float32)


@pytest.mark.parametrize('objective', ['drfl', 'maml', 'da_maml'])
def test_block_gradient_equals_autodiff_of_the_composition(objective):
  """Scalar inner value (DRFL, p = 1) and weights-shaped inner value (MAML, p = d)."""
  inner_batch, outer_batch = _batch(), _batch(shift=0.5)
  weights = (tf.constant(RNG.normal(size=D), tf.float32), tf.constant(0.2))
  obj = objectives.make_objective(objective, gamma=3.0, inner_learning_rate=0.01)
  hparams, reference = obj.hparams(), 10.0
  _, _, got = objectives.compositional_gradient(
    obj, MODEL, weights, (), inner_batch, outer_batch, hparams, reference
  )
  with tf.GradientTape() as tape:
    tape.watch(weights)
    composed = obj.outer(
      MODEL, obj.inner(MODEL, weights, (), inner_batch, hparams), outer_batch, hparams, reference
    )
  want = tape.gradient(composed, weights)
  for a, b in zip(got, want):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def _clients():
  return [_batch(12, shift=s) for s in (0.0, 0.4, 1.0)]


def _one_round(process, clients, weights):
  state = process.initialize()
  state = process.set_model_weights(state, tff.learning.models.ModelWeights(weights, ()))
  out = process.next(state, [tf.data.Dataset.from_tensor_slices(c) for c in clients])
  return out, process.get_model_weights(out.state).trainable


def test_drfl_client_weights_are_a_softmax_of_losses_up_to_the_common_scale():
  gamma, lr = 0.1, 0.01
  w0 = (RNG.normal(size=D).astype(np.float32), np.float32(0.1))
  process = comfedl.build_comfedl(
    MODEL, client_learning_rate=lr, gamma=gamma, local_steps=1, batch_size=12
  )
  clients = _clients()
  out, (w, b) = _one_round(process, clients, w0)
  assert np.all(np.isfinite(w))
  losses = np.array([0.5 * np.mean((x @ w0[0] + w0[1] - y) ** 2) for x, y in clients])
  grads = [ref.gradient(w0[0], w0[1], x, y) for x, y in clients]
  c = losses.max()
  assert out.metrics['client_work']['reference_loss'] == pytest.approx(c, rel=1e-5)
  scale = np.exp((losses - c) / gamma) / gamma  # the documented common scale exp(-c/gamma)
  want_w = w0[0] - lr * np.mean([s * g[0] for s, g in zip(scale, grads)], axis=0)
  np.testing.assert_allclose(w, want_w, rtol=1e-4, atol=1e-6)
  # The weights the round applied, read off its update (w0 - w = lr/m sum_i s_i g_i,
  # 3 gradients in 7 coordinates), are softmax(F / gamma) up to their common scale.
  grad_matrix = np.array([np.append(g[0], g[1]) for g in grads]).T
  step = np.append(w0[0] - w, w0[1] - b) * len(clients) / lr
  applied, residual, _, _ = np.linalg.lstsq(grad_matrix, step, rcond=None)
  assert residual.item() < 1e-6 * np.sum(step**2)
  softmax = np.exp(losses / gamma) / np.exp(losses / gamma).sum()
  np.testing.assert_allclose(applied / applied.sum(), softmax, rtol=1e-3, atol=1e-6)
  assert losses.max() - losses.min() > 5 * gamma  # the weights are far from uniform


def test_large_gamma_behaves_like_uniform_fedavg():
  gamma, lr = 1e4, 0.01
  clients = _clients()
  datasets = [tf.data.Dataset.from_tensor_slices(c) for c in clients]
  composed = comfedl.build_comfedl(
    MODEL, client_learning_rate=lr * gamma, gamma=gamma, local_steps=2, batch_size=6
  )
  plain = fedavg.build_fedavg(
    MODEL, client_learning_rate=lr, batch_size=6, client_weighting='uniform'
  )
  a, b = composed.initialize(), plain.initialize()
  for _ in range(3):
    a = composed.next(a, datasets).state
    b = plain.next(b, datasets).state
  for x, y in zip(composed.get_model_weights(a).trainable, plain.get_model_weights(b).trainable):
    np.testing.assert_allclose(x, y, rtol=2e-2, atol=1e-3)


def _numpy_scgdm(clients, rounds, *, eta, alpha, beta, tgamma, gamma, steps, batch):
  """Local-SCGDM with DRFL on linear regression, written from the spec."""
  w, b = np.zeros(D), 0.0
  u, m_w, m_b, c_prev, started = 0.0, np.zeros(D), 0.0, 0.0, False
  loss = lambda w, b, x, y: 0.5 * np.mean((x @ w + b - y) ** 2)
  for _ in range(rounds):
    c = max(loss(w, b, x, y) for x, y in clients)
    finals = []
    for x, y in clients:
      scale = np.exp((c_prev - c) / gamma) if started else 1.0
      cw, cb, cu, cmw, cmb, st = w.copy(), b, u, m_w * scale, m_b * scale, started
      for k in range(steps):
        idx = np.arange(k * batch, (k + 1) * batch) % len(y)
        xb, yb = x[idx], y[idx]
        value = loss(cw, cb, xb, yb)
        cu = (1 - tgamma * eta) * cu + tgamma * eta * value if st else value
        cot = np.exp((cu - c) / gamma) / gamma
        gw, gb = ref.gradient(cw, cb, xb, yb)
        zw, zb = cot * gw, cot * gb
        cmw = (1 - alpha * eta) * cmw + alpha * eta * zw if st else zw
        cmb = (1 - alpha * eta) * cmb + alpha * eta * zb if st else zb
        cw, cb, st = cw - beta * eta * cmw, cb - beta * eta * cmb, True
      finals.append((cw, cb, cu, cmw, cmb))
    w, b, u, m_w, m_b = (np.mean([f[i] for f in finals], axis=0) for i in range(5))
    c_prev, started = c, True
  return w, b, u, m_w


def test_local_scgdm_matches_numpy_reference():
  from tff_comp.algorithms import local_scgdm

  hp = dict(eta=0.05, alpha=2.0, beta=0.5, tgamma=3.0, gamma=5.0, steps=3, batch=4)
  rng = np.random.default_rng(5)
  clients = [_batch(n, shift=s, rng=rng) for n, s in ((7, 0.0), (10, 0.3), (5, 0.8))]
  process = algorithm_cases.stored_order(
    local_scgdm.local_scgdm(
      MODEL,
      client_learning_rate=hp['eta'],
      momentum_rate=hp['alpha'],
      beta=hp['beta'],
      tracking_gamma=hp['tgamma'],
      gamma=hp['gamma'],
      local_steps=hp['steps'],
      batch_size=hp['batch'],
    )
  )
  state = process.initialize()
  datasets = [tf.data.Dataset.from_tensor_slices(c) for c in clients]
  for _ in range(3):
    state = process.next(state, datasets).state
  w, b, u, m_w = _numpy_scgdm(clients, 3, **hp)
  # assert_allclose calls NaN equal to NaN: make sure the reference did not diverge.
  assert np.all(np.isfinite(w)) and np.isfinite(u) and np.abs(w).max() > 0.01
  got_w, got_b = process.get_model_weights(state).trainable
  np.testing.assert_allclose(got_w, w, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(got_b, b, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(state.finalizer.u, u, rtol=1e-4)
  np.testing.assert_allclose(state.finalizer.m[0], m_w, rtol=1e-4, atol=1e-6)
  assert state.finalizer.started == 1.0


def test_imbalanced_task_sizes_and_mnist_loader_offline(tmp_path):
  from tff_comp.tasks import imbalanced_digits

  task = imbalanced_digits.build_imbalanced_digits_task()
  sizes = [
    len(list(task.train_data.create_tf_dataset_for_client(c))) for c in task.train_data.client_ids
  ]
  assert sizes[1:] == [20] * 9 and sizes[0] > 1000
  metrics = task.evaluate(tuple(w for w in task.model.initial_weights[0]))
  assert {'average_accuracy', 'worst_accuracy'} <= set(metrics)
  assert not any(k.startswith('accuracy_') for k in metrics)  # per client: the CSVs
  # A small MNIST fixture in Keras' .npz format.
  rng = np.random.default_rng(0)
  fixture = tmp_path / 'mnist.npz'
  np.savez(
    fixture,
    x_train=rng.integers(0, 256, (1000, 28, 28), dtype=np.uint8),
    y_train=rng.integers(0, 10, 1000, dtype=np.uint8),
  )
  mnist = imbalanced_digits.build_imbalanced_digits_task(
    source='mnist', mnist_path=str(fixture), big_size=200
  )
  x, y = next(iter(mnist.train_data.create_tf_dataset_for_client('0').batch(1000)))
  assert x.shape == (200, 784) and float(tf.reduce_max(x)) <= 1.0
  assert mnist.model.input_spec[0].shape[1] == 784


def test_da_maml_reference_is_the_adapted_full_data_loss():
  obj = objectives.make_objective('da_maml', gamma=1.0, inner_learning_rate=0.01)
  weights = (tf.constant(RNG.normal(size=D), tf.float32), tf.constant(0.2))
  examples = _batch()
  adapted = obj.inner(MODEL, weights, (), examples, obj.hparams())
  want = model_ops.batch_loss(MODEL, adapted, (), examples)
  assert float(obj.reference_value(MODEL, weights, (), examples, obj.hparams())) == (
    pytest.approx(float(want))
  )
  assert float(want) < float(model_ops.batch_loss(MODEL, weights, (), examples))
