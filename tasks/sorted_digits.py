"""Label-sorted digits: the non-IID partition of Karimireddy, He and Jaggi (ICLR 2022,
"Byzantine-Robust Learning on Heterogeneous Datasets via Bucketing"), on data that ships.

They sort MNIST's training set by label and cut it into n = 25 contiguous equal shards,
so each worker holds one or two digits; the IID control shuffles before cutting. MNIST
is a download, so this task takes scikit-learn's bundled 8x8 digits (1,797 images,
pixels in [0, 1]; `base.bundled_digits`), the closest real digits data that ships:
60% training (cut into `num_clients` shards, `partition` 'sorted' or 'iid', or split
by Dirichlet(`alpha`) label proportions, 'dirichlet'), 20%
validation, 20% test, split stratified by `seed`. With 25 clients a shard holds 43 or
44 examples: under 'sorted' (seed 0), 16 clients hold one digit and 9 hold two.

Model: softmax regression (650 parameters; their CNN has 1.2 M). Metrics: test and
validation loss and accuracy, the training loss, and each client's accuracy on the
test examples of its own digits (`evaluate_clients`).
"""

from typing import Literal

import numpy as np
import tensorflow as tf

from tff_comp import models, registry
from tff_comp.ops import regularizers
from tff_comp.tasks import array_data, base, partitions

CLASSES = 10
PARTITIONS = (*partitions.SHARDS, 'dirichlet')


@registry.register_task('sorted_digits')
def build_sorted_digits_task(
  *,
  partition: Literal['sorted', 'iid', 'dirichlet'] = 'sorted',
  alpha: float = 0.5,
  num_clients: int = 25,
  seed: int = 0,
) -> base.Task:
  """Builds the label-sorted (or IID, or Dirichlet) digits task; see the module
  docstring.

  Args:
    partition: 'sorted' (by label, then cut: each client one or two digits), 'iid'
      (shuffled, then cut) or 'dirichlet' (each digit's examples split in proportions
      ~ Dirichlet(alpha): `partitions.dirichlet`).
    alpha: the Dirichlet concentration ('dirichlet' only; smaller: fewer digits a
      client).
    num_clients: clients, at most 100.
  """
  from sklearn import model_selection

  if partition not in PARTITIONS:
    raise ValueError(f'partition={partition!r} is unknown; choose one of {PARTITIONS}.')
  if not 1 <= num_clients <= 100:
    raise ValueError(f'num_clients must be in [1, 100], got {num_clients}.')
  if not (alpha > 0 and np.isfinite(alpha)):
    raise ValueError(f'alpha must be a positive number, got {alpha}.')
  x, y = base.bundled_digits()
  x_train, x_rest, y_train, y_rest = model_selection.train_test_split(
    x, y, test_size=0.4, stratify=y, random_state=seed
  )
  x_val, x_test, y_val, y_test = model_selection.train_test_split(
    x_rest, y_rest, test_size=0.5, stratify=y_rest, random_state=seed
  )
  rng = np.random.default_rng(seed)
  if partition == 'dirichlet':
    parts = partitions.dirichlet(y_train, num_clients, alpha, rng)
    layout = f'dirichlet{alpha:g}'
  else:
    parts, layout = partitions.shards(y_train, num_clients, partition, rng), partition
  ids = [f'{i:03d}' for i in range(num_clients)]
  train_data = array_data.cached_client_data(
    f'sorted-digits-{layout}-c{num_clients}-seed{seed}',
    ids,
    (x.shape[1],),
    tf.int32,
    lambda i: (x_train[parts[i]], y_train[parts[i]]),
  )

  def evaluate(weights, psi=None) -> base.Metrics:
    del psi
    return base.softmax_split_metrics(
      *weights, (x_train, y_train), (x_test, y_test), (x_val, y_val)
    )

  def evaluate_clients(weights) -> list[dict]:
    """Each client's accuracy on the test examples of the digits it holds."""
    kernel, bias = weights
    rows = []
    for i, part in enumerate(parts):
      mine = np.isin(y_test, np.unique(y_train[part]))
      loss, accuracy = base.softmax_scores(kernel, bias, x_test[mine], y_test[mine])
      rows.append(dict(client=ids[i], test_loss=loss, test_accuracy=accuracy))
    return rows

  return base.Task(
    name='sorted_digits',
    model=models.softmax_regression(x.shape[1], CLASSES),
    train_data=train_data,
    regularizer=regularizers.NoRegularizer(),
    evaluate=evaluate,
    evaluate_clients=evaluate_clients,
    defaults=dict(
      client_learning_rate=0.1,
      server_learning_rate=1.0,
      rounds=200,
      clients_per_round=num_clients,
      batch_size=16,
      local_epochs=1,
      eval_period=10,
    ),
  )
