"""Sinewave regression, the MAML benchmark used by Per-FedAvg and Local-SCGDM.

Each client is a task y = A sin(x - phi), A ~ U[0.1, 5], phi ~ U[0, pi], x ~ U[-5, 5],
with a K-shot train part and a K-shot test part (K = `shots`). Training clients hold
both parts as their data (algorithms draw their own batches); held-out clients are used
for personalized evaluation: adapt on the train part with `adapt_steps` steps of size
`adapt_lr`, score on the test part (mean and worst client loss, before and after). A
second set of `eval_clients` held-out clients, drawn after them, is scored the same way
for tuning (`validation_` metrics): a grid picks its configuration on those, never on
the reported ones; `train_` metrics score the training clients the same way (adapt on
their first K examples, score on the last K). Model: MLP 1-40-40-1.
"""

import numpy as np
import tensorflow as tf

from tff_comp import models, registry
from tff_comp.ops import regularizers
from tff_comp.tasks import array_data, base, personalization


def generate(num_clients: int, shots: int, rng: np.random.Generator):
  """[(x_train, y_train, x_test, y_test)] for `num_clients` sine tasks."""
  clients = []
  for _ in range(num_clients):
    amplitude, phase = rng.uniform(0.1, 5.0), rng.uniform(0, np.pi)
    x = rng.uniform(-5, 5, (2 * shots, 1)).astype(np.float32)
    y = (amplitude * np.sin(x[:, 0] - phase)).astype(np.float32)
    clients.append((x[:shots], y[:shots], x[shots:], y[shots:]))
  return clients


@registry.register_task('sinewave')
def build_sinewave_task(
  *,
  num_clients: int = 100,
  eval_clients: int = 50,
  shots: int = 10,
  adapt_lr: float = 0.01,
  adapt_steps: int = 1,
  seed: int = 0,
) -> base.Task:
  """Builds the sinewave task; see the module docstring.

  Args:
    num_clients: training clients (sine tasks).
    eval_clients: held-out clients of the personalized evaluation (and as many more for
      the `validation_` metrics).
    shots: K: examples in each client's train part and in its test part.
    adapt_lr: step size of the evaluation's adaptation steps.
    adapt_steps: adaptation steps each evaluation client takes on its train part.
  """
  if min(num_clients, eval_clients, shots, adapt_steps) < 1 or adapt_lr < 0:
    raise ValueError(
      'num_clients, eval_clients, shots, adapt_steps must be >= 1 and adapt_lr >= 0.'
    )
  rng = np.random.default_rng(seed)
  train = generate(num_clients, shots, rng)
  held_out = generate(eval_clients, shots, rng)
  validation = generate(eval_clients, shots, rng)
  ids = [str(i) for i in range(num_clients)]
  train_data = array_data.cached_client_data(
    f'sinewave-c{num_clients}-k{shots}-seed{seed}',
    ids,
    (1,),
    tf.float32,
    lambda i: (
      np.concatenate([train[i][0], train[i][2]]),
      np.concatenate([train[i][1], train[i][3]]),
    ),
  )
  model = models.mlp_regression((1, 40, 40, 1), seed=seed)

  def evaluate(weights, psi=None) -> base.Metrics:
    del psi

    def score(clients):
      return personalization.personalized_losses(
        model, weights, clients, alpha=adapt_lr, steps=adapt_steps
      )

    # The MAML objective on the training clients too (the Local-SCGDM slides' train loss).
    return dict(
      base.with_validation(score, held_out, validation),
      **{f'train_{k}': v for k, v in score(train).items()},
    )

  def evaluate_clients(weights) -> list[dict]:
    rows = personalization.adapted_scores(
      model, weights, held_out, alpha=adapt_lr, steps=adapt_steps
    )
    return [dict(client=f'heldout_{i}', **row) for i, row in enumerate(rows)]

  return base.Task(
    name='sinewave',
    model=model,
    train_data=train_data,
    regularizer=regularizers.NoRegularizer(),
    evaluate=evaluate,
    evaluate_clients=evaluate_clients,
    defaults=dict(
      client_learning_rate=0.005,
      server_learning_rate=1.0,
      rounds=300,
      clients_per_round=10,
      batch_size=5,
      local_epochs=1,
      eval_period=20,
    ),
  )
