"""L1-regularized logistic regression in high dimension with few samples per client.

Stand-in for the paper's fMRI task (Yuan et al., ICML 2021: 39,912 voxels, 59 clients
of 18 scans), generated so that it needs no download:

    y ~ Bernoulli(sigmoid(<w*, x>)),  x ~ N(mu_c, I),  mu_c ~ N(0, mean_scale^2 I)
    objective: (1/N) sum_i CE(y_i, sigmoid(<w, x_i> + b)) + lam ||w||_1

(the data have no intercept; the model fits an unpenalized intercept b).

w* has `support` nonzero coordinates of magnitude `signal`/sqrt(support), so <w*, x>
has standard deviation ~ signal. Training: `num_clients` clients x `examples` each;
validation: `validation_clients` held-out clients of the same size.
Metrics: validation loss and accuracy, density of w, support F1 against w*.
"""

import numpy as np
import tensorflow as tf

from tff_comp import models, registry
from tff_comp.ops import regularizers
from tff_comp.tasks import array_data, base, lasso


def _generate(dim, support, signal, num_clients, examples, validation_clients, mean_scale, seed):
  streams = np.random.SeedSequence([seed, dim, support]).spawn(num_clients + validation_clients + 1)
  rng = np.random.default_rng(streams[0])
  w_star = np.zeros(dim, np.float32)
  chosen = rng.choice(dim, support, replace=False)
  w_star[chosen] = rng.choice([-1.0, 1.0], support) * signal / np.sqrt(support)
  clients = []
  for stream in streams[1:]:
    r = np.random.default_rng(stream)
    x = (mean_scale * r.normal(size=dim) + r.normal(size=(examples, dim))).astype(np.float32)
    p = 1 / (1 + np.exp(-(x @ w_star)))
    clients.append((x, (r.random(examples) < p).astype(np.float32)))
  return w_star, clients[:num_clients], clients[num_clients:]


@registry.register_task('sparse_logreg')
def build_sparse_logreg_task(
  *,
  dim: int = 5000,
  support: int = 50,
  signal: float = 4.0,
  num_clients: int = 59,
  examples: int = 18,
  validation_clients: int = 10,
  mean_scale: float = 0.5,
  l1: float = 0.01,
  seed: int = 0,
) -> base.Task:
  """Builds the sparse logistic regression task; see the module docstring.

  Args:
    dim: features d.
    support: nonzero coordinates of w*.
    signal: standard deviation of <w*, x> (the signal's strength).
    num_clients: training clients.
    examples: examples per client.
    validation_clients: held-out clients of the validation metrics.
    mean_scale: standard deviation of the clients' feature means (feature
      heterogeneity).
    l1: L1 strength lam of the objective.
  """
  if min(dim, support, num_clients, examples, validation_clients) < 1 or support > dim:
    raise ValueError(
      'dim, support, num_clients, examples and validation_clients must be >= 1 and support <= dim.'
    )
  if l1 < 0:
    raise ValueError(f'l1 must be >= 0, got {l1}.')
  array_data.check_size(dim, (num_clients + validation_clients) * examples)
  w_star, train, validation = _generate(
    dim, support, signal, num_clients, examples, validation_clients, mean_scale, seed
  )
  ids = [str(i) for i in range(num_clients)]
  key = (
    f'sparse_logreg-d{dim}-s{support}-sig{signal}-c{num_clients}x{examples}'
    f'-m{mean_scale}-seed{seed}'
  )
  train_data = array_data.cached_client_data(key, ids, (dim,), tf.float32, lambda i: train[i])
  x_val = np.concatenate([x for x, _ in validation])
  y_val = np.concatenate([y for _, y in validation])
  regularizer = regularizers.L1(strength=l1, targets=(0,))

  def evaluate(weights, psi=regularizer) -> base.Metrics:
    del psi
    kernel, bias = weights
    logits = x_val @ kernel + bias
    loss = np.mean(np.maximum(logits, 0) - logits * y_val + np.log1p(np.exp(-np.abs(logits))))
    support_metrics = lasso.support_metrics(kernel, w_star)
    return dict(
      validation_loss=float(loss),
      validation_accuracy=float(np.mean((logits > 0) == (y_val > 0.5))),
      density=support_metrics['density'],
      f1=support_metrics['f1'],
    )

  return base.Task(
    name='sparse_logreg',
    model=models.logistic_regression(dim),
    train_data=train_data,
    regularizer=regularizer,
    evaluate=evaluate,
    defaults=dict(
      # FedDualAvg at 30 rounds: validation loss 0.58, accuracy 0.71 (at 0.01 and 1.0,
      # before 2026-12-05: 0.66, 0.61; log 2 = 0.693, majority 0.567).
      client_learning_rate=0.03,
      server_learning_rate=3.0,
      rounds=100,
      clients_per_round=10,
      batch_size=6,
      local_epochs=1,
      eval_period=10,
    ),
  )
