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
                        clients: Sequence[tuple], *, alpha: float, steps: int) -> dict:
  """{'loss_before', 'loss_after', 'worst_before', 'worst_after'} over `clients`,
  each client a tuple (x_train, y_train, x_test, y_test)."""
  weights = tuple(tf.constant(w) for w in trainable)
  before, after = [], []
  for x_train, y_train, x_test, y_test in clients:
    test = (tf.constant(x_test), tf.constant(y_test))
    before.append(float(model_ops.batch_loss(model, weights, (), test)))
    adapted = weights
    for _ in range(steps):
      _, grad = model_ops.batch_loss_and_gradient(
          model, adapted, (), (tf.constant(x_train), tf.constant(y_train)))
      adapted = tuple(w - alpha * g for w, g in zip(adapted, grad))
    after.append(float(model_ops.batch_loss(model, adapted, (), test)))
  return dict(loss_before=float(np.mean(before)), worst_before=float(np.max(before)),
              loss_after=float(np.mean(after)), worst_after=float(np.max(after)))
