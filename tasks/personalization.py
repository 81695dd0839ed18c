"""Personalized evaluation on clients with a train part and a test part.

`personalized_losses`: the global model takes `steps` gradient steps of size `alpha` on
each client's train part and is scored on its test part; reported: mean and worst
client loss before and after adaptation. Works for any algorithm's model (the
Per-FedAvg paper compares FedAvg and Per-FedAvg this way).
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


def _summary(scores: list, prefix: str, suffix: str) -> dict:
  """Mean and worst client of (loss, accuracy) pairs, as `{prefix}loss{suffix}`,
  `{prefix}worst{suffix}` and, for classifiers, the accuracies."""
  losses = [s[0] for s in scores]
  metrics = {f'{prefix}loss{suffix}': float(np.mean(losses)),
             f'{prefix}worst{suffix}': float(np.max(losses))}
  if scores[0][1] is not None:
    accs = [s[1] for s in scores]
    metrics.update({f'{prefix}accuracy{suffix}': float(np.mean(accs)),
                    f'{prefix}worst_accuracy{suffix}': float(np.min(accs))})
  return metrics


def personalized_losses(model, trainable: Sequence[np.ndarray],
                        clients: Sequence[Client], *, alpha: float, steps: int,
                        accuracy: bool = False) -> dict:
  """{'loss_before', 'loss_after', 'worst_before', 'worst_after'} over `clients`;
  with `accuracy` (a classifier's logits), also 'accuracy_before/after' and
  'worst_accuracy_before/after'."""
  weights = tuple(tf.constant(w) for w in trainable)
  before, after = [], []
  for x_train, y_train, x_test, y_test in clients:
    before.append(_scores(model, weights, x_test, y_test, accuracy))
    adapted = weights
    for _ in range(steps):
      _, adapted = model_ops.adapt(model, adapted, (), (x_train, y_train), alpha)
    after.append(_scores(model, adapted, x_test, y_test, accuracy))
  return {**_summary(before, '', '_before'), **_summary(after, '', '_after')}


def personal_model_losses(model, personal: Sequence[Sequence[np.ndarray]],
                          clients: Sequence[Client], *, accuracy: bool = False) -> dict:
  """{'personal_loss', 'personal_worst'} (and 'personal_accuracy',
  'personal_worst_accuracy') of client i's model `personal[i]` on its test part."""
  scores = [_scores(model, tuple(tf.constant(w) for w in weights), x_test, y_test, accuracy)
            for weights, (_, _, x_test, y_test) in zip(personal, clients)]
  return _summary(scores, 'personal_', '')
