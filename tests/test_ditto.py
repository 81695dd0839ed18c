"""Ditto: global FedAvg plus per-client personal models, against NumPy."""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tests import algorithm_cases
from tests import numpy_reference as ref
from tff_comp import evaluation, models
from tff_comp.algorithms import ditto
from tff_comp.learning_process import client_work, composer
from tff_comp.run import callbacks
from tff_comp.runtime import inprocess
from tff_comp.tasks import array_data

D, LR, PERSONAL_LR, LAM, BATCH = 4, 0.05, 0.1, 0.5, 4
ROUNDS = (['c', 'a'], ['b', 'c'])  # client 'b' is first seen in round 2


def _clients():
  return ref.shifted_clients(7, ((9, 0.0), (6, 2.0), (8, -1.0)), D)


def _numpy_ditto(clients, personal_lr=PERSONAL_LR):
  """Ditto's rounds in NumPy: returns global (w, b) and personal [(v, c)] per client."""
  w, b = np.zeros(D), 0.0
  personal = [(np.zeros(D), 0.0) for _ in clients]
  for sampled in ROUNDS:
    deltas, weights = [], []
    for name in sampled:
      i = 'abc'.index(name)
      x, y = clients[i]
      cw, cb = w.copy(), b
      v, c = personal[i]
      for xb, yb in ref.batches(x, y, BATCH):
        gw, gb = ref.gradient(cw, cb, xb, yb)
        cw, cb = cw - LR * gw, cb - LR * gb
        gv, gc = ref.gradient(v, c, xb, yb)
        v, c = v - personal_lr * (gv + LAM * (v - w)), c - personal_lr * (gc + LAM * (c - b))
      personal[i] = (v, c)
      deltas.append((cw - w, cb - b))
      weights.append(len(y))
    p = np.array(weights) / sum(weights)
    w = w + sum(pi * d[0] for pi, d in zip(p, deltas))
    b = b + sum(pi * d[1] for pi, d in zip(p, deltas))
  return (w, b), personal


def _process(data, client_learning_rate=LR, **kwargs):
  process = algorithm_cases.stored_order(
    ditto.ditto(
      models.linear_regression((D,)),
      num_clients=3,
      client_learning_rate=client_learning_rate,
      batch_size=BATCH,
      **kwargs,
    )
  )
  assert isinstance(process, composer.PersonalizedLearningProcess)
  return process, tff.simulation.compose_dataset_computation_with_learning_process(
    client_work.indexed_dataset_computation(data), process
  )


@pytest.mark.parametrize('tied', [False, True])
def test_two_rounds_match_numpy(tmp_path, monkeypatch, tied):
  """With `tied` (personal_learning_rate=0), eta_p follows the client learning rate,
  also when it is set after building (as reproduce.py's grids do)."""
  monkeypatch.setenv('TFF_COMP_DATA_DIR', str(tmp_path))
  clients = _clients()
  data = array_data.cached_client_data(
    'ditto-test', ['a', 'b', 'c'], (D,), tf.float32, lambda i: clients[i]
  )
  if tied:
    process, composed = _process(
      data, client_learning_rate=0.5, lam=LAM, personal_learning_rate=0.0
    )
    state = callbacks.set_learning_rates(composed, composed.initialize(), LR, 1.0)
  else:
    process, composed = _process(data, lam=LAM, personal_learning_rate=PERSONAL_LR)
    state = composed.initialize()
  for sampled in ROUNDS:
    state = composed.next(state, sampled).state

  (w, b), personal = _numpy_ditto(clients, LR if tied else PERSONAL_LR)
  got = composed.get_model_weights(state).trainable
  np.testing.assert_allclose(got[0], w, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(got[1], b, rtol=1e-4, atol=1e-5)
  kernels, biases = process.get_personal_weights(state)
  for i, (v, c) in enumerate(personal):
    np.testing.assert_allclose(kernels[i], v, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(biases[i], c, rtol=1e-4, atol=1e-5)
  # Personal models differ from one another and from the global model.
  assert np.min([np.abs(kernels[i] - got[0]).max() for i in range(3)]) > 1e-2


@pytest.mark.parametrize('lam', [0.0, 1e4])
def test_lambda_limits(tmp_path, monkeypatch, lam):
  """lam = 0: v is plain local SGD; lam large (with eta_p lam < 2): v stays near w_r."""
  monkeypatch.setenv('TFF_COMP_DATA_DIR', str(tmp_path))
  clients = _clients()
  data = array_data.cached_client_data(
    'ditto-test', ['a', 'b', 'c'], (D,), tf.float32, lambda i: clients[i]
  )
  personal_lr = 1e-4 if lam else PERSONAL_LR
  process, composed = _process(data, lam=lam, personal_learning_rate=personal_lr)
  state = composed.next(composed.initialize(), ['a']).state
  kernel = process.get_personal_weights(state)[0][0]
  x, y = clients[0]
  v, c = np.zeros(D), 0.0
  for xb, yb in ref.batches(x, y, BATCH):
    gv, gc = ref.gradient(v, c, xb, yb)
    v, c = v - personal_lr * gv, c - personal_lr * gc
  if lam:
    # Each step pulls v back toward w_r = 0 by a factor 1 - eta_p lam = 0: v is one
    # gradient step of size eta_p from 0.
    gv, _ = ref.gradient(np.zeros(D), 0.0, *list(ref.batches(x, y, BATCH))[-1])
    np.testing.assert_allclose(kernel, -personal_lr * gv, rtol=1e-3, atol=1e-7)
  else:
    np.testing.assert_allclose(kernel, v, rtol=1e-4, atol=1e-5)


def test_global_model_is_tff_fedavg(tmp_path):
  """Ditto's global model is FedAvg's: equal to TFF's built-in on the same inputs."""
  clients = _clients()
  model = models.linear_regression((D,))
  ours = algorithm_cases.stored_order(
    ditto.ditto(
      model,
      num_clients=3,
      client_learning_rate=LR,
      server_learning_rate=0.7,
      batch_size=BATCH,
      lam=LAM,
    )
  )
  theirs = tff.learning.algorithms.build_weighted_fed_avg(
    model,
    client_optimizer_fn=tff.learning.optimizers.build_sgdm(LR),
    server_optimizer_fn=tff.learning.optimizers.build_sgdm(0.7),
  )
  indexed = [
    tf.data.Dataset.from_tensor_slices((x, y)).map(
      lambda x, y, i=i: client_work.IndexedExample(client_index=i, example=(x, y))
    )
    for i, (x, y) in enumerate(clients)
  ]
  plain = [tf.data.Dataset.from_tensor_slices(c).batch(BATCH) for c in clients]
  ours_state, theirs_state = ours.initialize(), theirs.initialize()
  for sampled in ROUNDS:
    chosen = ['abc'.index(name) for name in sampled]
    ours_state = ours.next(ours_state, [indexed[i] for i in chosen]).state
    theirs_state = theirs.next(theirs_state, [plain[i] for i in chosen]).state
  want = theirs.get_model_weights(theirs_state).trainable
  assert np.abs(want[0]).max() > 0.1
  for a, b in zip(ours.get_model_weights(ours_state).trainable, want):
    np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)


def test_experiment_scores_personal_models_or_refuses_the_task():
  from tff_comp import experiment

  prepared = experiment.prepare(
    experiment.ExperimentConfig.of(algorithm='ditto', task='dominant_class')
  )
  process = inprocess.build(prepared.build(), prepared.task.train_data)
  metrics = evaluation.evaluator(prepared.task, process)(process.initialize())
  # Every personal model starts at the global model.
  assert metrics['personal_loss'] == pytest.approx(metrics['loss_before'], rel=1e-5)
  assert metrics['personal_worst_accuracy'] == metrics['worst_accuracy_before']

  prepared = experiment.prepare(
    experiment.ExperimentConfig.of(
      algorithm='ditto', task='sinewave', clients_per_round=5, task_options=dict(num_clients=5)
    )
  )
  with pytest.raises(experiment.ConfigError, match='cannot evaluate them'):
    evaluation.evaluator(
      prepared.task, inprocess.build(prepared.build(), prepared.task.train_data), algorithm='ditto'
    )
