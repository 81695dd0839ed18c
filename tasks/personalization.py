"""Personalized evaluation on clients with a train part and a test part.

`personalized_losses`: the global model takes `steps` gradient steps of size `alpha` on
each client's train part and is scored on its test part; reported: mean and worst
client loss before and after adaptation (`adapted_scores`: per client). Works for any
algorithm's model (the Per-FedAvg paper compares FedAvg and Per-FedAvg this way).
`personal_model_losses`: each client's own personal model (Ditto's) scored on its test
part.
"""

from collections.abc import Sequence

import numpy as np
import tensorflow as tf

from tff_comp.ops import model_ops

Client = tuple  # (x_train, y_train, x_test, y_test)


def _scores(model, weights, x, y, accuracy: bool) -> tuple[float, float | None]:
  """(loss, accuracy or None) of `weights` on (x, y)."""
  loss = float(model_ops.batch_loss(model, weights, (), (x, y)))
  if not accuracy:
    return loss, None
  logits = model.predict_on_batch((weights, ()), x, training=False)
  return loss, float(np.mean(np.argmax(logits, axis=-1) == np.asarray(y)))


def summarize(rows: Sequence[dict], prefix: str = '') -> dict:
  """Mean and worst client of every metric in per-client `rows`: `{prefix}{name}` and
  `{prefix}worst_{name}` (the largest of a loss, the smallest of an accuracy)."""
  summary = {}
  for name in rows[0]:
    values = [row[name] for row in rows]
    summary[f'{prefix}{name}'] = float(np.mean(values))
    summary[f'{prefix}worst_{name}'] = float(
      np.max(values) if name.startswith('loss') else np.min(values)
    )
  return summary


def _row(scores: tuple[float, float | None], suffix: str) -> dict:
  loss, accuracy = scores
  return {f'loss{suffix}': loss, **({} if accuracy is None else {f'accuracy{suffix}': accuracy})}


def adapted_scores(
  model,
  trainable: Sequence[np.ndarray],
  clients: Sequence[Client],
  *,
  alpha: float,
  steps: int,
  accuracy: bool = False,
) -> list[dict]:
  """Per client: 'loss_before' and 'loss_after' of the global model on its test part,
  before and after `steps` adaptation steps on its train part; with `accuracy` (a
  classifier's logits), also 'accuracy_before' and 'accuracy_after'."""
  weights = tuple(tf.constant(w) for w in trainable)
  rows = []
  for x_train, y_train, x_test, y_test in clients:
    adapted = weights
    for _ in range(steps):
      _, adapted = model_ops.adapt(model, adapted, (), (x_train, y_train), alpha)
    rows.append(
      {
        **_row(_scores(model, weights, x_test, y_test, accuracy), '_before'),
        **_row(_scores(model, adapted, x_test, y_test, accuracy), '_after'),
      }
    )
  return rows


def personalized_losses(
  model,
  trainable: Sequence[np.ndarray],
  clients: Sequence[Client],
  *,
  alpha: float,
  steps: int,
  accuracy: bool = False,
) -> dict:
  """`summarize` of `adapted_scores`: 'loss_before', 'worst_loss_before', 'loss_after',
  'worst_loss_after' (and the accuracies, 'worst_accuracy_*' the smallest)."""
  return summarize(
    adapted_scores(model, trainable, clients, alpha=alpha, steps=steps, accuracy=accuracy)
  )


def personal_model_scores(
  model,
  personal: Sequence[Sequence[np.ndarray]],
  clients: Sequence[Client],
  *,
  accuracy: bool = False,
) -> list[dict]:
  """Per client: 'personal_loss' (and 'personal_accuracy') of client i's model
  `personal[i]` on its test part."""
  return [
    {
      f'personal_{k}': v
      for k, v in _row(
        _scores(model, tuple(tf.constant(w) for w in weights), x_test, y_test, accuracy), ''
      ).items()
    }
    for weights, (_, _, x_test, y_test) in zip(personal, clients, strict=True)
  ]


def personal_model_losses(
  model,
  personal: Sequence[Sequence[np.ndarray]],
  clients: Sequence[Client],
  *,
  accuracy: bool = False,
) -> dict:
  """{'personal_loss', 'personal_worst_loss'} (and 'personal_accuracy',
  'personal_worst_accuracy'): `summarize` of `personal_model_scores`."""
  rows = personal_model_scores(model, personal, clients, accuracy=accuracy)
  return summarize(
    [{k.removeprefix('personal_'): v for k, v in r.items()} for r in rows], 'personal_'
  )
