"""Constrained federated classification (Yuan et al., ICML 2021, section 6: EMNIST
logistic regression under an L1- or L2-ball constraint).

    min_W (1/N) sum_i CE(softmax(x_i W + b), y_i)  s.t.  ||W||_1 <= rho  (or ||W||_2)

Data, by `source`:
* 'sklearn' (default, no download): scikit-learn's bundled 8x8 handwritten digits
  (1,797 images, pixels scaled to [0, 1]). 20% (stratified) is the test set; the rest is
  split over `num_clients` clients with label proportions drawn from Dirichlet(alpha)
  per client (a documented, seeded non-IID partition: the bundled copy has no writer
  ids). Examples cycle through labels so every client gets at least one.
* 'emnist': Federated EMNIST digits through TFF's own loader
  (`tff.simulation.datasets.emnist.load_data`), reading `emnist_all.sqlite` offline from
  `emnist_cache_dir` (`tff_files`; a missing file is one line saying where to get it);
  28x28 pixels, writers as clients.

Metrics: test accuracy and loss, density of W, and the constraint violation
max(0, ||W|| - rho), which a proximal algorithm keeps at zero every round (float32
projection error up to 1e-5 relative is counted as zero).
"""

from typing import Literal

import numpy as np
import tensorflow as tf

from tff_comp import models, registry
from tff_comp.ops import regularizers
from tff_comp.tasks import array_data, base, partitions, tff_files

CONSTRAINTS = {'l1_ball': 1, 'l2_ball': 2}
DENSITY_CUTOFF = 1e-4


def _sklearn_digits(num_clients: int, alpha: float, seed: int):
  from sklearn import model_selection

  x, y = base.bundled_digits()
  x_train, x_test, y_train, y_test = model_selection.train_test_split(
    x, y, test_size=0.2, stratify=y, random_state=seed
  )
  parts = partitions.dirichlet(y_train, num_clients, alpha, np.random.default_rng(seed))
  ids = [f'{i:03d}' for i in range(num_clients)]
  train = array_data.cached_client_data(
    f'digits-c{num_clients}-a{alpha}-seed{seed}',
    ids,
    (64,),
    tf.int32,
    lambda i: (x_train[parts[i]], y_train[parts[i]]),
  )
  return train, x_test, y_test


def load_emnist(cache_dir: str, *, max_test_examples: int | None = None):
  """Federated EMNIST digits from TFF's loader as (train ClientData of (x[784], y),
  test x, test y), read offline from `cache_dir`/emnist_all.sqlite (`tff_files`)."""
  train, test = tff_files.load(
    'emnist',
    cache_dir,
    only_digits=True,
    hint='point --constrained_digits_emnist_cache_dir at its'
    ' folder, or use --constrained_digits_source=sklearn',
  )

  def to_examples(dataset):
    return dataset.map(lambda e: (tf.reshape(e['pixels'], [784]), e['label']))

  test_ds = to_examples(test.create_tf_dataset_from_all_clients())
  if max_test_examples:
    test_ds = test_ds.take(max_test_examples)
  x_test, y_test = (np.stack(t) for t in zip(*test_ds.as_numpy_iterator()))
  return train.preprocess(to_examples), x_test, y_test


@registry.register_task('constrained_digits')
def build_constrained_digits_task(
  *,
  source: Literal['sklearn', 'emnist'] = 'sklearn',
  constraint: Literal['l1_ball', 'l2_ball'] = 'l1_ball',
  radius: float = 20.0,
  num_clients: int = 30,
  alpha: float = 0.5,
  emnist_cache_dir: str = '',
  seed: int = 0,
) -> base.Task:
  """Builds the constrained classification task; see the module docstring.

  Args:
    source: 'sklearn' (scikit-learn's bundled 8x8 digits, no download) or 'emnist'
      (Federated EMNIST through TFF's loader).
    constraint: the constraint set of W: 'l1_ball' or 'l2_ball'.
    radius: radius rho of the constraint ball.
    num_clients: clients of the 'sklearn' split.
    alpha: Dirichlet concentration of the clients' label proportions ('sklearn'; smaller
      is more heterogeneous).
    emnist_cache_dir: the folder holding TFF's emnist_all.sqlite
      ('emnist').
  """
  if constraint not in CONSTRAINTS:
    raise ValueError(f'constraint={constraint!r} is unknown; choose one of {list(CONSTRAINTS)}.')
  if radius <= 0 or alpha <= 0 or num_clients < 1:
    raise ValueError(
      f'radius and alpha must be > 0 and num_clients >= 1, got {radius}, {alpha}, {num_clients}.'
    )
  if source == 'sklearn':
    train, x_test, y_test = _sklearn_digits(num_clients, alpha, seed)
  elif source == 'emnist':
    if not emnist_cache_dir:
      raise ValueError(
        "source=emnist needs emnist_cache_dir, the folder holding TFF's emnist_all.sqlite."
      )
    train, x_test, y_test = load_emnist(emnist_cache_dir)
  else:
    raise ValueError(f"source={source!r} is unknown; choose 'sklearn' or 'emnist'.")
  num_features = x_test.shape[1]
  regularizer = regularizers.make_regularizer(constraint, radius, (0,))
  order = CONSTRAINTS[constraint]

  def evaluate(weights, psi=regularizer) -> base.Metrics:
    kernel, bias = weights
    loss, accuracy = base.softmax_scores(kernel, bias, x_test, y_test)
    norm = float(np.linalg.norm(kernel.ravel(), ord=order))
    rho = psi.strength if psi.is_constraint else radius
    return dict(
      accuracy=accuracy,
      loss=loss,
      density=float(np.mean(np.abs(kernel) > DENSITY_CUTOFF)),
      constraint_violation=max(0.0, norm - rho * (1 + 1e-5)),
    )

  return base.Task(
    name='constrained_digits',
    model=models.softmax_regression(num_features, 10),
    train_data=train,
    regularizer=regularizer,
    evaluate=evaluate,
    defaults=dict(
      client_learning_rate=0.1,
      server_learning_rate=1.0,
      rounds=100,
      clients_per_round=10,
      batch_size=10,
      local_epochs=1,
      eval_period=10,
    ),
  )
