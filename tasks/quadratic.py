"""FedNova's objective-inconsistency check case (Wang et al., NeurIPS 2020, section 3).

    F_i(x) = 0.5 ||x - e_i||^2,  client i holds n_i copies of e_i

With batch size 1 and one epoch client i takes tau_i = n_i exact gradient steps and
has weight p_i = n_i / n. The true optimum of sum_i p_i F_i is sum_i p_i e_i; with
step eta, FedAvg's fixed point is sum p_i c_i e_i / sum p_i c_i with
c_i = 1 - (1 - eta)^tau_i, FedNova's the same with c_i / tau_i (`fixed_point`).
"""

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_comp import registry
from tff_comp.ops import regularizers
from tff_comp.tasks import array_data, base


def quadratic_model(dim: int) -> tff.learning.models.FunctionalModel:
  """Weights x in R^dim; an example is (e, 0) with loss 0.5 ||x - e||^2."""

  @tf.function
  def predict_on_batch(weights, e, training=True):
    del training
    (x,), _ = weights
    return 0.5 * tf.reduce_sum(tf.square(x - e), axis=1)

  @tf.function
  def loss(output, label, sample_weight=None):
    del label, sample_weight
    return tf.reduce_mean(output)

  return tff.learning.models.FunctionalModel(
    initial_weights=((np.zeros([dim], np.float32),), ()),
    predict_on_batch_fn=predict_on_batch,
    loss_fn=loss,
    input_spec=(tf.TensorSpec([None, dim], tf.float32), tf.TensorSpec([None], tf.float32)),
  )


def fixed_point(centers: np.ndarray, steps: np.ndarray, eta: float, *, normalized: bool):
  """The exact fixed point of FedAvg (normalized=False) or FedNova with full participation."""
  p = steps / steps.sum()
  c = 1 - (1 - eta) ** steps
  if normalized:
    c = c / steps
  return (p * c) @ centers / np.sum(p * c)


@registry.register_task('quadratic')
def build_quadratic_task(
  *, dim: int = 4, steps: str = '1,2,5,10,20,40', seed: int = 0
) -> base.Task:
  """Builds the check case; `steps` lists each client's n_i (= tau_i with batch 1).

  Args:
    dim: dimension of x.
    steps: comma-separated n_i of the clients (their steps tau_i at batch size 1).
  """
  try:
    counts = np.array([int(s) for s in steps.split(',')])
  except ValueError as e:
    raise ValueError(f'steps={steps!r} must be comma-separated integers.') from e
  if dim < 1 or len(counts) < 2 or counts.min() < 1:
    raise ValueError('need dim >= 1 and at least two clients with >= 1 step each.')
  centers = np.random.default_rng(seed).normal(size=(len(counts), dim)).astype(np.float32)
  ids = [str(i) for i in range(len(counts))]
  train_data = array_data.cached_client_data(
    f'quadratic-d{dim}-{"_".join(map(str, counts))}-seed{seed}',
    ids,
    (dim,),
    tf.float32,
    lambda i: (np.repeat(centers[i : i + 1], counts[i], 0), np.zeros(counts[i], np.float32)),
  )
  p = counts / counts.sum()
  optimum = p @ centers

  def evaluate(weights, psi=None) -> base.Metrics:
    del psi
    (x,) = weights
    objective = float(p @ (0.5 * np.sum((x - centers) ** 2, axis=1)))
    return dict(objective=objective, distance_to_optimum=float(np.linalg.norm(x - optimum)))

  return base.Task(
    name='quadratic',
    model=quadratic_model(dim),
    train_data=train_data,
    regularizer=regularizers.NoRegularizer(),
    evaluate=evaluate,
    defaults=dict(
      client_learning_rate=0.01,
      server_learning_rate=1.0,
      rounds=300,
      clients_per_round=len(counts),
      batch_size=1,
      local_epochs=1,
      eval_period=50,
    ),
  )
