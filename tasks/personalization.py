"""Personalized evaluation: adapt the global model on each held-out client, then score.

For each held-out client, the global model takes `steps` gradient steps of size
`alpha` on the client's train part and is scored on its test part. Reported: mean and
worst client loss before and after adaptation. Works for any algorithm's model (the
Per-FedAvg paper compares FedAvg and Per-FedAvg this way).
"""

from collections.abc import Sequence

import numpy as np
import tensorflow as tf

from tff_comp.ops import model_ops


def personalized_losses(model, trainable: Sequence[np.ndarray],
                        clients: Sequence[tuple], *, alpha: float, steps: int,
                        accuracy: bool = False) -> dict:
  """{'loss_before', 'loss_after', 'worst_before', 'worst_after'} over `clients`,
  each client a tuple (x_train, y_train, x_test, y_test); with `accuracy` (a
  classifier's logits), also 'accuracy_before/after' and 'worst_accuracy_before/after'."""
  weights = tuple(tf.constant(w) for w in trainable)
  results = {key: [] for key in ('loss_before', 'loss_after', 'accuracy_before',
                                 'accuracy_after')}

  def score(w, x, y, when):
    results[f'loss_{when}'].append(float(model_ops.batch_loss(model, w, (), (x, y))))
    if accuracy:
      logits = model.predict_on_batch((w, ()), x, training=False)
      results[f'accuracy_{when}'].append(
          float(np.mean(np.argmax(logits, axis=-1) == y.numpy())))

  for x_train, y_train, x_test, y_test in clients:
    test_x, test_y = tf.constant(x_test), tf.constant(y_test)
    score(weights, test_x, test_y, 'before')
    adapted = weights
    for _ in range(steps):
      _, grad = model_ops.batch_loss_and_gradient(
          model, adapted, (), (tf.constant(x_train), tf.constant(y_train)))
      adapted = tuple(w - alpha * g for w, g in zip(adapted, grad))
    score(adapted, test_x, test_y, 'after')
  metrics = {}
  for when in ('before', 'after'):
    losses = results[f'loss_{when}']
    metrics.update({f'loss_{when}': float(np.mean(losses)),
                    f'worst_{when}': float(np.max(losses))})
    if accuracy:
      accs = results[f'accuracy_{when}']
      metrics.update({f'accuracy_{when}': float(np.mean(accs)),
                      f'worst_accuracy_{when}': float(np.min(accs))})
  return metrics
