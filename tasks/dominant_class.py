"""Dominant-class classification for personalized FL (DA-MAML setup of ComFedL).

10 clients; client i draws a fraction `rho` (paper: 0.28) of its examples from class i
and (1 - rho)/9 from each other class. Each client's examples are split 80/10/10 into a
train, a validation and a test part; evaluation is personalized: every client adapts the
global model with `adapt_steps` steps of size `adapt_lr` on its train part and is scored
on its test part (mean and worst client accuracy and loss, before and after), and on its
validation part for the `validation_` metrics a grid tunes on. Algorithms with personal
models (Ditto) are also scored with each client's own model on its test and validation
parts. `source`: 'sklearn' (bundled 8x8 digits, no download; `examples` per client) or
'cifar10' (from `cifar10_path`, an .npz in Keras' format, or Keras' downloader). Model:
multinomial logistic regression.
"""

from typing import Literal

import numpy as np
import tensorflow as tf

from tff_comp import models, registry
from tff_comp.ops import regularizers
from tff_comp.tasks import array_data, base, keras_images, personalization

NUM_CLIENTS = 10


def dominant_partition(
  labels: np.ndarray, rho: float, examples: int, rng: np.random.Generator
) -> list[np.ndarray]:
  """Indices per client: round(rho * examples) of class i, the rest spread evenly
  over the other classes; no example is used twice."""
  pools = {c: list(rng.permutation(np.flatnonzero(labels == c))) for c in range(NUM_CLIENTS)}
  own = int(round(rho * examples))
  other = (examples - own) // (NUM_CLIENTS - 1)
  parts = []
  for i in range(NUM_CLIENTS):
    take = []
    for c in range(NUM_CLIENTS):
      count = own if c == i else other
      if len(pools[c]) < count:
        raise ValueError(f'class {c} has too few examples for examples={examples}.')
      take += [pools[c].pop() for _ in range(count)]
    parts.append(rng.permutation(np.array(take)))
  return parts


@registry.register_task('dominant_class')
def build_dominant_class_task(
  *,
  source: Literal['sklearn', 'cifar10'] = 'sklearn',
  rho: float = 0.28,
  examples: int = 150,
  cifar10_path: str = '',
  adapt_lr: float = 0.1,
  adapt_steps: int = 1,
  model: Literal['softmax', 'cnn'] = 'softmax',
  seed: int = 0,
) -> base.Task:
  """Builds the dominant-class task; see the module docstring.

  Args:
    source: 'sklearn' (bundled 8x8 digits, no download) or 'cifar10' (from
      cifar10_path).
    rho: fraction of client i's examples drawn from class i (the paper: 0.28).
    examples: examples per client ('sklearn').
    cifar10_path: CIFAR-10 as an .npz in Keras' format ('cifar10'; empty: Keras'
      downloader).
    adapt_lr: step size of the evaluation's adaptation steps.
    adapt_steps: adaptation steps each evaluation client takes on its train part.
    model: 'softmax' (multinomial logistic regression) or 'cnn' (`models.small_cnn`,
      the kind of model the DA-MAML paper used on CIFAR-10).
  """
  if model not in ('softmax', 'cnn'):
    raise ValueError(f"model={model!r} is unknown; choose 'softmax' or 'cnn'.")
  if not 0 <= rho <= 1:
    raise ValueError(f'rho must be in [0, 1], got {rho}.')
  if source == 'sklearn':
    x, y = base.bundled_digits()
  elif source == 'cifar10':
    x, y = keras_images.load_images('cifar10', cifar10_path)
  else:
    raise ValueError(f"source={source!r} is unknown; choose 'sklearn' or 'cifar10'.")
  parts = dominant_partition(y, rho, examples, np.random.default_rng(seed))
  cut, val_cut = int(0.8 * examples), int(0.9 * examples)
  clients = [(x[p[:cut]], y[p[:cut]], x[p[val_cut:]], y[p[val_cut:]]) for p in parts]
  validation = [(x[p[:cut]], y[p[:cut]], x[p[cut:val_cut]], y[p[cut:val_cut]]) for p in parts]
  ids = [str(i) for i in range(NUM_CLIENTS)]
  key = f'dominant-{source}-rho{rho}-n{examples}-seed{seed}'
  if cifar10_path:
    key += '-' + array_data.file_digest(cifar10_path)
  train_data = array_data.cached_client_data(
    key, ids, (x.shape[1],), tf.int32, lambda i: clients[i][:2]
  )
  shape = (8, 8, 1) if source == 'sklearn' else (32, 32, 3)
  model = (
    models.small_cnn(shape, 10, seed=seed)
    if model == 'cnn'
    else models.softmax_regression(x.shape[1], 10)
  )

  def evaluate(weights, psi=None) -> base.Metrics:
    del psi
    return base.with_validation(
      lambda parts: personalization.personalized_losses(
        model, weights, parts, alpha=adapt_lr, steps=adapt_steps, accuracy=True
      ),
      clients,
      validation,
    )

  def evaluate_personal(personal) -> base.Metrics:
    return base.with_validation(
      lambda parts: personalization.personal_model_losses(
        model, [personal[i] for i in ids], parts, accuracy=True
      ),
      clients,
      validation,
    )

  def evaluate_personal_clients(personal) -> list[dict]:
    rows = personalization.personal_model_scores(
      model, [personal[i] for i in ids], clients, accuracy=True
    )
    return [dict(client=cid, **row) for cid, row in zip(ids, rows, strict=True)]

  def evaluate_clients(weights) -> list[dict]:
    rows = personalization.adapted_scores(
      model, weights, clients, alpha=adapt_lr, steps=adapt_steps, accuracy=True
    )
    return [dict(client=cid, **row) for cid, row in zip(ids, rows)]

  return base.Task(
    name='dominant_class',
    model=model,
    train_data=train_data,
    regularizer=regularizers.NoRegularizer(),
    evaluate=evaluate,
    evaluate_personal=evaluate_personal,
    evaluate_clients=evaluate_clients,
    evaluate_personal_clients=evaluate_personal_clients,
    defaults=dict(
      client_learning_rate=0.05,
      server_learning_rate=1.0,
      rounds=100,
      clients_per_round=NUM_CLIENTS,
      batch_size=10,
      local_epochs=1,
      eval_period=10,
    ),
  )
