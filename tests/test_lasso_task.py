"""The lasso task: deterministic data built at the worker, metrics, reference, and the
paper's headline (FedDualAvg recovers the support within 100 rounds)."""

import hashlib
from unittest import mock
import warnings

import numpy as np
import pytest
import threadpoolctl

from tff_comp import experiment
from tff_comp.ops import regularizers
from tff_comp.tasks import lasso, many_models


@pytest.fixture(scope='module')
def task():
  return lasso.build_lasso_task(dataset='I', seed=0)


def test_data_are_deterministic_and_read_at_the_worker(task):
  again = lasso.build_lasso_task(dataset='I', seed=0)
  other = lasso.build_lasso_task(dataset='I', seed=1)
  assert task.num_clients == 64
  comp = task.train_data.dataset_computation
  assert comp.type_signature.parameter.dtype == np.str_  # only the id crosses in
  x, y = next(iter(task.train_data.create_tf_dataset_for_client('3').batch(1000)))
  x2, _ = next(iter(again.train_data.create_tf_dataset_for_client('3').batch(1000)))
  x3, _ = next(iter(other.train_data.create_tf_dataset_for_client('3').batch(1000)))
  assert x.shape == (128, 1024) and y.shape == (128,)
  np.testing.assert_array_equal(x, x2)
  assert not np.allclose(x, x3)
  w_star, clients, _ = lasso._generate('I', 0, 1.0, 1.0)
  np.testing.assert_allclose(x, clients[3][0])
  # The recipe: y = <w*, x> + 1 + N(0, 1).
  residual = y.numpy() - x.numpy() @ w_star - 1.0
  assert abs(residual.std() - 1.0) < 0.2


def test_heldout_clients_left_the_training_data_as_committed_results_used_them():
  """Dataset I's training data hash as generated before the held-out clients existed."""
  _, clients, heldout = lasso._generate('I', 0, 1.0, 1.0)
  digest = hashlib.sha256(b''.join(x.tobytes() + y.tobytes() for x, y in clients))
  assert digest.hexdigest() == ('8d8512215f9853e3308b34a4b5ac084387f9207aa63347d83382dc1cbbb5e746')
  assert len(heldout) == lasso.HELDOUT_CLIENTS
  assert not any(np.array_equal(h[0], c[0]) for h in heldout for c in clients)


@pytest.mark.parametrize('dataset,support,clients', [('II', 256, 64), ('IV', 512, 256)])
def test_dataset_variants(dataset, support, clients):
  w_star, data, _ = lasso._generate(dataset, 0, 1.0, 1.0)
  assert int(w_star.sum()) == support and len(data) == clients


def test_metrics_on_known_weights(task):
  _, clients, _ = lasso._generate('I', 0, 1.0, 1.0)
  truth = np.zeros(1024, np.float32)
  truth[:512] = 1.0
  perfect = task.evaluate((truth, np.float32(1.0)), task.regularizer)
  assert perfect['f1'] == perfect['precision'] == perfect['recall'] == 1.0
  assert perfect['density'] == 0.5
  assert perfect['train_loss'] == pytest.approx(0.5, rel=0.1)  # 0.5 * noise variance
  assert perfect['heldout_loss'] == pytest.approx(0.5, rel=0.1)
  half = truth.copy()
  half[256:512] = 0
  half[600] = 1
  m = lasso.support_metrics(half, truth)
  assert m['precision'] == pytest.approx(256 / 257) and m['recall'] == 0.5


def test_models_scored_together_equal_each_scored_alone(task):
  """`evaluate_many` (a grid's trials, the data read once) gives each model what
  `evaluate` and the losses computed on the whole pooled data give it, to the bit."""
  _, clients, heldout = lasso._generate('I', 0, 1.0, 1.0)
  rng = np.random.default_rng(0)
  models = [
    ((rng.standard_normal(1024).astype(np.float32), np.float32(b)), psi)
    for b, psi in (
      (0.5, task.regularizer),
      (-1.0, regularizers.NoRegularizer()),
      (2.0, regularizers.L1(strength=0.1, targets=(0,))),
    )
  ]
  together = task.evaluate_many(models)
  assert together == [task.evaluate(*model) for model in models]
  for ((kernel, b), psi), metrics in zip(models, together):
    for name, data in (('train_loss', clients), ('heldout_loss', heldout)):
      x, y = (np.concatenate(part) for part in zip(*data))
      assert metrics[name] == 0.5 * float(np.mean((x @ kernel + b - y) ** 2)), name
    assert metrics['train_objective'] == metrics['train_loss'] + float(psi.value([kernel]))


def test_a_diverged_model_scores_inf_without_a_numpy_warning(task):
  """A model whose weights blew up (a grid's too large learning rate) scores an
  infinite loss, and NumPy's overflow warning does not reach the run's output."""
  kernel = np.full(1024, 1e30, np.float32)
  with warnings.catch_warnings():
    warnings.simplefilter('error')
    metrics = task.evaluate_many([((kernel, np.float32(0.0)), task.regularizer)])[0]
  assert np.isinf(metrics['train_loss']) and np.isinf(metrics['heldout_loss'])


@pytest.mark.parametrize('threads', [1, 2])
def test_products_read_in_blocks_equal_the_whole_products(threads):
  """Blocks of 64 and 320 rows (and one block) of a matrix of lasso's shape (its rows a
  multiple of 64: two BLAS threads split a whole product of 1,001 rows at row 500,
  which sums two rows otherwise), on one BLAS thread (a grid's) and two."""
  rng = np.random.default_rng(1)
  x = rng.standard_normal((1024, 1024)).astype(np.float32)
  kernels = [rng.standard_normal(1024).astype(np.float32) for _ in range(5)]
  with threadpoolctl.threadpool_limits(threads, user_api='blas'):
    for rows in (1, 350, 1024):  # rounded to 64, 320, 1024 rows a block
      with mock.patch.object(many_models, 'BLOCK_BYTES', rows * x[:1].nbytes):
        products = many_models.products(x, kernels)
      assert products.shape == (5, 1024)
      for row, kernel in zip(products, kernels):
        np.testing.assert_array_equal(row, x @ kernel)


@pytest.mark.slow  # about 20 s: ISTA on the pooled data, and the task's own solver
def test_centralized_reference(task):
  ref = task.reference()
  # The pooled lasso optimum finds every true coordinate and a few false ones (see the
  # module docstring); it is a reference for objective values, not a perfect support.
  assert ref['recall'] == 1.0 and ref['f1'] > 0.99
  gd = _proximal_gradient_reference(task)
  assert ref['train_objective'] == pytest.approx(gd, rel=1e-3)
  # The pooled-data optimum fits its own data better than unseen clients'.
  assert ref['train_loss'] < ref['heldout_loss']


def _proximal_gradient_reference(task):
  """An independent solver: ISTA on the pooled data (NumPy), enough iterations."""
  _, clients, _ = lasso._generate('I', 0, 1.0, 1.0)
  x = np.concatenate([c[0] for c in clients]).astype(np.float64)
  y = np.concatenate([c[1] for c in clients]).astype(np.float64)
  xm, ym = x.mean(0), y.mean()
  xc, yc = x - xm, y - ym
  step = 1.0 / np.linalg.eigvalsh(xc.T @ xc / len(y)).max()
  w = np.zeros(x.shape[1])
  v, t = w.copy(), 1.0
  for _ in range(3000):  # FISTA
    grad = xc.T @ (xc @ v - yc) / len(y)
    w_next = np.sign(v - step * grad) * np.maximum(np.abs(v - step * grad) - step * 0.3, 0)
    t_next = (1 + np.sqrt(1 + 4 * t * t)) / 2
    v = w_next + (t - 1) / t_next * (w_next - w)
    w, t = w_next, t_next
  b = ym - xm @ w
  return task.evaluate((w.astype(np.float32), np.float32(b)), task.regularizer)['train_objective']


def test_feddualavg_recovers_the_support_within_100_rounds(tmp_path):
  """The paper's headline with the task defaults: 10 clients/round, batch 10, 1 epoch."""
  prepared = experiment.prepare(
    experiment.ExperimentConfig.of(
      algorithm='feddualavg', task='lasso', rounds=100, output_dir=str(tmp_path)
    )
  )
  assert prepared.settings.clients_per_round == 10
  assert prepared.settings.batch_size == 10 and prepared.settings.local_epochs == 1
  final = experiment.run_experiment(prepared, show_progress=False)
  assert final['eval/f1'] >= 0.99
  rows = (tmp_path / 'metrics.csv').read_text().splitlines()
  assert len(rows) == 102  # header, round 0, rounds 1-100
