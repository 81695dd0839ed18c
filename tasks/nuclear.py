"""Federated low-rank matrix estimation with the nuclear norm (Yuan et al., ICML 2021, 5.2).

    y = <W*, X> + b* + eps,  X in R^{32 x 32},  eps ~ N(0, noise^2)
    objective: (1/N) sum_i 0.5 (y_i - <W, X_i> - b)^2 + lam ||W||_*

W* = U V^T with orthonormal U, V in R^{32 x r}: rank 16 (I), 4 (II), 1 (III); IV as I
with 256 clients x 32 examples; otherwise 64 clients x 128 examples, features drawn as
in lasso (client means mu_c ~ N(0, I)). With b* = 1, unit noise and lam = 0.3 the
centralized optimum (`reference()`, FISTA with singular-value thresholding on the pooled
data) has exactly the true rank for datasets I-III (measured; the default suite checks
II).
Validation: 8 further clients, unseen in training.
"""

import functools
from typing import Literal

import numpy as np
import tensorflow as tf

from tff_comp import models, registry
from tff_comp.ops import regularizers
from tff_comp.tasks import array_data, base, linear_synthetic, many_models

SIDE = 32
# dataset -> (rank, clients, examples per client)
DATASETS = {'I': (16, 64, 128), 'II': (4, 64, 128), 'III': (1, 64, 128), 'IV': (16, 256, 32)}
RANK_CUTOFF = 1e-4
VALIDATION_CLIENTS = 8


def _generate(dataset: str, seed: int, bias: float, noise: float):
  rank, num_clients, n = DATASETS[dataset]
  streams = np.random.SeedSequence([seed, 100 + list(DATASETS).index(dataset)]).spawn(
    num_clients + VALIDATION_CLIENTS + 1
  )
  rng = np.random.default_rng(streams[0])
  u, _ = np.linalg.qr(rng.normal(size=(SIDE, SIDE)))
  v, _ = np.linalg.qr(rng.normal(size=(SIDE, SIDE)))
  w_star = (u[:, :rank] @ v[:, :rank].T).astype(np.float32)
  clients = linear_synthetic.generate_clients(w_star, streams[1:], n, bias=bias, noise=noise)
  return w_star, clients[:num_clients], clients[num_clients:]


def rank_of(matrix: np.ndarray, cutoff: float = RANK_CUTOFF) -> int:
  """Number of singular values above `cutoff`."""
  return int(np.sum(np.linalg.svd(matrix, compute_uv=False) > cutoff))


def fista_nuclear(x: np.ndarray, y: np.ndarray, lam: float, iterations: int = 800):
  """Centralized solver: accelerated proximal gradient with singular-value thresholding
  on the pooled data (an intercept, unpenalized). Returns (W, b)."""
  n = len(y)
  a = x.reshape(n, -1).astype(np.float64)
  a_mean, y_mean = a.mean(0), y.mean()
  ac, yc = a - a_mean, y - y_mean
  # The least-squares gradient from the d x d Gram matrix, formed once: a step costs
  # d^2, not the 2 n d of the pooled data's products (n = 8,192 examples, d = 1,024).
  gram, moment = ac.T @ ac / n, ac.T @ yc / n
  step = 1.0 / np.linalg.eigvalsh(gram).max()
  shape = x.shape[1:]
  w = np.zeros(shape)
  v, t = w.copy(), 1.0
  for _ in range(iterations):
    grad = (gram @ v.ravel() - moment).reshape(shape)
    u, s, vt = np.linalg.svd(v - step * grad)
    w_next = (u * np.maximum(s - step * lam, 0)) @ vt
    t_next = (1 + np.sqrt(1 + 4 * t * t)) / 2
    v = w_next + (t - 1) / t_next * (w_next - w)
    w, t = w_next, t_next
  return w.astype(np.float32), np.float32(y_mean - a_mean @ w.ravel())


@registry.register_task('nuclear')
def build_nuclear_task(
  *,
  dataset: Literal['I', 'II', 'III', 'IV'] = 'I',
  strength: float = 0.3,
  noise: float = 1.0,
  bias: float = 1.0,
  seed: int = 0,
) -> base.Task:
  """Builds federated nuclear-norm matrix estimation; `strength` is lam.

  Args:
    dataset: 'I', 'II', 'III': true rank 16, 4, 1, 64 clients x 128 examples; 'IV': as I
      with 256 clients x 32.
    strength: nuclear-norm strength lam of the objective.
    noise: standard deviation of the label noise.
    bias: the true intercept b*.
  """
  if dataset not in DATASETS:
    raise ValueError(f'dataset={dataset!r} is unknown; choose one of {list(DATASETS)}.')
  if strength < 0 or noise < 0:
    raise ValueError(f'strength and noise must be >= 0, got {strength}, {noise}.')
  w_star, clients, validation = _generate(dataset, seed, bias, noise)
  ids = [str(i) for i in range(len(clients))]
  train_data = array_data.cached_client_data(
    f'nuclear-{dataset}-seed{seed}-b{bias}-noise{noise}',
    ids,
    (SIDE, SIDE),
    tf.float32,
    lambda i: clients[i],
  )
  x_all = np.concatenate([x for x, _ in clients]).reshape(-1, SIDE * SIDE)
  y_all = np.concatenate([y for _, y in clients])
  x_val = np.concatenate([x for x, _ in validation]).reshape(-1, SIDE * SIDE)
  y_val = np.concatenate([y for _, y in validation])
  regularizer = regularizers.Nuclear(strength=strength, targets=(0,))

  def evaluate_many(models) -> list[base.Metrics]:
    """Each (weights, psi)'s metrics, the data read once for all the models
    (`many_models.products`)."""
    kernels = [np.asarray(kernel).ravel() for (kernel, _), _ in models]
    biases = [b for (_, b), _ in models]
    train, validation = (
      many_models.mean_squared_errors(x, y, kernels, biases)
      for x, y in ((x_all, y_all), (x_val, y_val))
    )
    metrics = []
    for t, ((kernel, _), psi) in enumerate(models):
      loss = 0.5 * train[t]
      penalty = float(np.asarray(psi.value([tf.constant(kernel)])))
      metrics.append(
        dict(  # train_*: on the pooled training data; validation: unseen clients
          train_loss=loss,
          train_objective=loss + penalty,
          validation_mse=validation[t],
          rank=float(rank_of(kernel)),
          frobenius_error=float(np.linalg.norm(kernel - w_star)),
        )
      )
    return metrics

  def evaluate(weights, psi=regularizer) -> base.Metrics:
    return evaluate_many([(weights, psi)])[0]

  @functools.cache
  def reference() -> base.Metrics:
    x = np.concatenate([x for x, _ in clients])
    return evaluate(fista_nuclear(x, y_all.astype(np.float64), strength))

  return base.Task(
    name='nuclear',
    model=models.linear_regression((SIDE, SIDE)),
    train_data=train_data,
    regularizer=regularizer,
    evaluate=evaluate,
    evaluate_many=evaluate_many,
    defaults=dict(
      client_learning_rate=1e-3,
      server_learning_rate=10.0,
      rounds=200,
      clients_per_round=10,
      batch_size=10,
      local_epochs=1,
      eval_period=10,
    ),
    reference=reference,
  )
