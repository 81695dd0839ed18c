"""Server-side math of the composite algorithms, in pure TensorFlow."""

import tensorflow as tf

from tff_comp.ops import regularizers as regularizers_lib
from tff_comp.ops.model_ops import Weights


def mirror_descent_server_step(
  weights_after_optimizer: Weights,
  regularizer: regularizers_lib.Regularizer,
  server_learning_rate: tf.Tensor,
  mean_lr_sum: tf.Tensor,
) -> Weights:
  """FedMiD: w_{r+1} = prox_{eta_s eta_c K psi}(w_r + eta_s Delta).

  `weights_after_optimizer` is w_r + eta_s Delta (the server optimizer's step);
  eta_c K is generalized to the clients' mean sum of eta_c.
  """
  return regularizer.prox(weights_after_optimizer, server_learning_rate * mean_lr_sum)


def dual_averaging_server_step(
  dual_after_optimizer: Weights,
  elapsed: tf.Tensor,
  regularizer: regularizers_lib.Regularizer,
  server_learning_rate: tf.Tensor,
  mean_lr_sum: tf.Tensor,
) -> tuple[Weights, tf.Tensor]:
  """FedDualAvg: c_{r+1} = c_r + eta_s mean(sum eta_c); w_{r+1} = prox_{c_{r+1} psi}(z_{r+1}).

  `dual_after_optimizer` is z_{r+1} = z_r + eta_s Delta. With equal step counts
  c_{r+1} = eta_s eta_c (r + 1) K, as in the paper. Returns (w_{r+1}, c_{r+1}).
  """
  new_elapsed = elapsed + server_learning_rate * mean_lr_sum
  return regularizer.prox(dual_after_optimizer, new_elapsed), new_elapsed


def project_simplex(v: tf.Tensor) -> tf.Tensor:
  """Euclidean projection of a vector onto the probability simplex."""
  return tf.nn.relu(v - regularizers_lib.simplex_threshold(v, 1.0))


def exponentiated_gradient_step(p: tf.Tensor, gradient: tf.Tensor, learning_rate) -> tf.Tensor:
  """p <- p exp(lr g) / sum(p exp(lr g)): mirror ascent on the simplex (entropy)."""
  logits = tf.math.log(p) + learning_rate * gradient
  return tf.nn.softmax(logits)


def replace_rows(tables: Weights, new_tables: Weights, visited: tf.Tensor) -> Weights:
  """Per-client tables (Ditto's personal models): row i of each table becomes row i of
  the corresponding new table where visited[i] > 0, and is kept otherwise."""
  mask = visited > 0
  return tuple(
    tf.where(tf.reshape(mask, [-1] + [1] * (old.shape.rank - 1)), new, old)
    for old, new in zip(tables, new_tables)
  )
