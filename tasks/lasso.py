"""Federated LASSO (Yuan, Zaheer, Reddi, ICML 2021, section 6).

    y = <w*, x> + b* + eps,  eps ~ N(0, noise^2),  d = 1024
    objective: (1/N) sum_i 0.5 (y_i - <w, x_i> - b)^2 + lam ||w||_1

Client c draws a fixed mean mu_c ~ N(0, I) and samples x ~ N(mu_c, I) (non-IID
features). Datasets: w* = ones on the first 512 (I), 256 (II), 128 (III) coordinates;
64 clients x 128 examples; IV as I with 256 clients x 32 examples. Defaults: b* = 1,
unit noise, lam = 0.3 (the spec's).

The centralized optimum (`reference()`) is not exactly the true support: on dataset I
it finds all 512 true coordinates plus about 5 false ones (F1 ~ 0.995) for every lam
in [0.05, 0.45], noise 0.5 or 1 and several seeds. 8,192 samples at 50% sparsity in
d = 1024 sit near the sample size lasso needs for exact recovery
(about 2 s log(d - s) ~ 6,400 for an isotropic design), and the 64 client means make
the pooled design correlated. Early-stopped federated solutions can be sparser.
"""

import functools
from typing import Literal

import numpy as np
import tensorflow as tf

from tff_comp import models, registry
from tff_comp.ops import regularizers
from tff_comp.tasks import array_data, base, linear_synthetic, many_models

DIM = 1024
# dataset -> (support size, clients, examples per client)
DATASETS = {'I': (512, 64, 128), 'II': (256, 64, 128), 'III': (128, 64, 128), 'IV': (512, 256, 32)}
SUPPORT_CUTOFF = 1e-4
HELDOUT_CLIENTS = 8  # unseen in training, for heldout_loss


def support_metrics(
  kernel: np.ndarray, truth: np.ndarray, cutoff: float = SUPPORT_CUTOFF
) -> dict[str, float]:
  """Support precision, recall, F1 and density (|w| <= cutoff counts as zero)."""
  found = np.abs(kernel.reshape(-1)) > cutoff
  true = np.abs(truth.reshape(-1)) > 0
  hits = float(np.sum(found & true))
  precision = hits / max(float(found.sum()), 1.0)
  recall = hits / max(float(true.sum()), 1.0)
  f1 = 2 * precision * recall / max(precision + recall, 1e-12)
  return dict(precision=precision, recall=recall, f1=f1, density=float(found.mean()))


def _generate(dataset: str, seed: int, bias: float, noise: float):
  """(w*, training clients' (x, y), held-out clients' (x, y)) from the seed.

  The held-out clients draw from the streams after the training clients' (a
  SeedSequence spawns children in order), so adding them left the training data as
  they were.
  """
  support, num_clients, n = DATASETS[dataset]
  w_star = np.zeros(DIM, np.float32)
  w_star[:support] = 1.0
  streams = np.random.SeedSequence([seed, list(DATASETS).index(dataset)])
  clients = linear_synthetic.generate_clients(
    w_star, streams.spawn(num_clients), n, bias=bias, noise=noise
  )
  heldout = linear_synthetic.generate_clients(
    w_star, streams.spawn(HELDOUT_CLIENTS), n, bias=bias, noise=noise
  )
  return w_star, clients, heldout


@registry.register_task('lasso')
def build_lasso_task(
  *,
  dataset: Literal['I', 'II', 'III', 'IV'] = 'I',
  l1: float = 0.3,
  noise: float = 1.0,
  bias: float = 1.0,
  seed: int = 0,
) -> base.Task:
  """Builds federated LASSO; `l1` is lam, `dataset` one of I, II, III, IV.

  Args:
    dataset: 'I', 'II', 'III': 512, 256, 128 true coordinates, 64 clients x 128
      examples; 'IV': as I with 256 clients x 32.
    l1: L1 strength lam of the objective.
    noise: standard deviation of the label noise.
    bias: the true intercept b*.
  """
  if dataset not in DATASETS:
    raise ValueError(f'dataset={dataset!r} is unknown; choose one of {list(DATASETS)}.')
  if l1 < 0 or noise < 0:
    raise ValueError(f'l1 and noise must be >= 0, got l1={l1}, noise={noise}.')
  w_star, clients, heldout = _generate(dataset, seed, bias, noise)
  ids = [str(i) for i in range(len(clients))]
  key = f'lasso-{dataset}-seed{seed}-b{bias}-noise{noise}'
  train_data = array_data.cached_client_data(key, ids, (DIM,), tf.float32, lambda i: clients[i])
  x_all = np.concatenate([x for x, _ in clients])
  y_all = np.concatenate([y for _, y in clients])
  x_heldout = np.concatenate([x for x, _ in heldout])
  y_heldout = np.concatenate([y for _, y in heldout])
  regularizer = regularizers.L1(strength=l1, targets=(0,))

  def evaluate_many(models) -> list[base.Metrics]:
    """Each (weights, psi)'s metrics: train_*: on the pooled training data;
    heldout_loss: on 8 unseen clients. The data are read once for all the models
    (`many_models.products`)."""
    kernels = [np.asarray(kernel) for (kernel, _), _ in models]
    biases = [b for (_, b), _ in models]
    train, heldout = (
      many_models.mean_squared_errors(x, y, kernels, biases)
      for x, y in ((x_all, y_all), (x_heldout, y_heldout))
    )
    metrics = []
    for t, ((kernel, _), psi) in enumerate(models):
      value = float(np.asarray(psi.value([tf.constant(kernel)])))
      metrics.append(
        dict(
          train_loss=0.5 * train[t],
          train_objective=0.5 * train[t] + value,
          heldout_loss=0.5 * heldout[t],
          **support_metrics(kernel, w_star),
        )
      )
    return metrics

  def evaluate(weights, psi=regularizer) -> base.Metrics:
    return evaluate_many([(weights, psi)])[0]

  @functools.cache
  def reference() -> base.Metrics:
    """The centralized optimum on the pooled data (scikit-learn's coordinate descent,
    whose objective (1/2n)||y - Xw - b||^2 + alpha||w||_1 is ours with alpha = l1)."""
    from sklearn import linear_model

    solver = linear_model.Lasso(alpha=l1, tol=1e-8, max_iter=100_000)
    solver.fit(x_all.astype(np.float64), y_all.astype(np.float64))
    return evaluate((solver.coef_.astype(np.float32), np.float32(solver.intercept_)))

  return base.Task(
    name='lasso',
    model=models.linear_regression((DIM,)),
    train_data=train_data,
    regularizer=regularizer,
    evaluate=evaluate,
    evaluate_many=evaluate_many,
    defaults=dict(
      client_learning_rate=1e-3,
      server_learning_rate=10.0,
      rounds=100,
      clients_per_round=10,
      batch_size=10,
      local_epochs=1,
      eval_period=10,
    ),
    reference=reference,
  )
