"""Synthetic(alpha, beta) (Li et al., FedProx, MLSys 2020; used by FedNova).

Client k: u_k ~ N(0, alpha), W_k ~ N(u_k, 1)^{60x10}, b_k ~ N(u_k, 1)^10,
B_k ~ N(0, beta), v_k ~ N(B_k, 1)^60, Sigma = diag(j^-1.2), x ~ N(v_k, Sigma),
y = argmax softmax(W_k^T x + b_k); n_k = int(lognormal(4, 2)) + 50; 30 clients.
alpha controls how much local models differ, beta how much local data differ.
Synthetic-IID (the same paper's control, `iid=True`): one W ~ N(0, 1)^{60x10} and
b ~ N(0, 1)^10 for every client, and every client's x ~ N(0, Sigma). Each
client's examples are split 80/10/10 into train, validation and test. Model: softmax
regression. Metrics: training loss on all clients' train parts, test loss and accuracy
on the test parts, and `validation_loss` and `validation_accuracy` on the validation
parts (what a grid tunes on).
"""

import numpy as np
import tensorflow as tf

from tff_comp import models, registry
from tff_comp.ops import regularizers
from tff_comp.tasks import array_data, base

DIM, CLASSES = 60, 10


def generate(alpha: float, beta: float, num_clients: int, seed: int, iid: bool = False):
  """[(x, y)] per client, following the FedProx reference recipe (`iid`: its
  Synthetic-IID)."""
  rng = np.random.default_rng(seed)
  sizes = rng.lognormal(4, 2, num_clients).astype(int) + 50
  sigma = np.arange(1, DIM + 1) ** -1.2
  shared = (rng.normal(0, 1, (DIM, CLASSES)), rng.normal(0, 1, CLASSES)) if iid else None
  clients = []
  for k in range(num_clients):
    if shared is not None:
      (w, b), v = shared, np.zeros(DIM)
    else:
      u = rng.normal(0, np.sqrt(alpha))
      w = rng.normal(u, 1, (DIM, CLASSES))
      b = rng.normal(u, 1, CLASSES)
      v = rng.normal(rng.normal(0, np.sqrt(beta)), 1, DIM)
    x = v + rng.normal(size=(sizes[k], DIM)) * np.sqrt(sigma)
    y = np.argmax(x @ w + b, axis=1)
    clients.append((x.astype(np.float32), y.astype(np.int32)))
  return clients


@registry.register_task('synthetic')
def build_synthetic_task(
  *,
  alpha: float = 1.0,
  beta: float = 1.0,
  iid: bool = False,
  num_clients: int = 30,
  seed: int = 0,
) -> base.Task:
  """Builds Synthetic(alpha, beta), or Synthetic-IID.

  Args:
    alpha: how much the clients' local models differ.
    beta: how much the clients' features differ.
    iid: FedProx's Synthetic-IID: one model and one feature distribution for every
      client (the control without heterogeneity; alpha and beta do not apply).
    num_clients: clients.
  """
  if alpha < 0 or beta < 0 or num_clients < 1:
    raise ValueError(
      f'need alpha, beta >= 0 and num_clients >= 1; got {alpha}, {beta}, {num_clients}.'
    )
  if iid and (alpha, beta) != (1.0, 1.0):
    raise ValueError(
      '--synthetic_iid has one model and one feature distribution: drop alpha and beta.'
    )
  clients = generate(alpha, beta, num_clients, seed, iid)
  cut = [int(0.8 * len(y)) for _, y in clients]
  ids = [str(i) for i in range(num_clients)]
  train_data = array_data.cached_client_data(
    f'synthetic-{"iid" if iid else f"a{alpha}-b{beta}"}-c{num_clients}-seed{seed}',
    ids,
    (DIM,),
    tf.int32,
    lambda i: (clients[i][0][: cut[i]], clients[i][1][: cut[i]]),
  )
  x_train = np.concatenate([x[:c] for (x, _), c in zip(clients, cut)])
  y_train = np.concatenate([y[:c] for (_, y), c in zip(clients, cut)])
  # Validation: the first half of each client's remaining 20%, test the second.
  val_cut = [c + (len(y) - c) // 2 for (_, y), c in zip(clients, cut)]
  x_val = np.concatenate([x[c:v] for (x, _), c, v in zip(clients, cut, val_cut)])
  y_val = np.concatenate([y[c:v] for (_, y), c, v in zip(clients, cut, val_cut)])
  x_test = np.concatenate([x[v:] for (x, _), v in zip(clients, val_cut)])
  y_test = np.concatenate([y[v:] for (_, y), v in zip(clients, val_cut)])

  def evaluate(weights, psi=None) -> base.Metrics:
    del psi
    return base.softmax_split_metrics(
      *weights, (x_train, y_train), (x_test, y_test), (x_val, y_val)
    )

  def evaluate_clients(weights) -> list[dict]:
    """Each client's loss and accuracy on its own test part."""
    kernel, bias = weights
    rows = []
    for i, ((x, y), v) in enumerate(zip(clients, val_cut)):
      loss, accuracy = base.softmax_scores(kernel, bias, x[v:], y[v:])
      rows.append(dict(client=ids[i], test_loss=loss, test_accuracy=accuracy))
    return rows

  return base.Task(
    name='synthetic',
    model=models.softmax_regression(DIM, CLASSES),
    train_data=train_data,
    regularizer=regularizers.NoRegularizer(),
    evaluate=evaluate,
    evaluate_clients=evaluate_clients,
    defaults=dict(
      client_learning_rate=0.01,
      server_learning_rate=1.0,
      rounds=200,
      clients_per_round=10,
      batch_size=50,
      local_epochs=2,
      eval_period=10,
    ),
  )
