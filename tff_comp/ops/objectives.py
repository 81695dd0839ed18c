"""Compositional objectives g_i(f_i(w)) and their stochastic gradient, in pure TF.

An objective supplies the inner function f (a batch -> a value in R^p, here a tensor or a
structure of tensors) and the outer function g (value, batch -> scalar). The stochastic
compositional gradient

    grad g(f(w; B); B~)^T J f(w; B)

is a vector-Jacobian product: the outer gradient at the inner value is the cotangent
pulled back through the inner function by one reverse pass. No Jacobian is formed.

References: Huang, Li. Compositional federated learning (ComFedL); Gao, Li, Huang.
Local stochastic compositional gradient descent with momentum (Local-SCGDM).
"""

import abc
import typing
from typing import Any, Literal

import tensorflow as tf

from tff_comp.ops import model_ops

Weights = model_ops.Weights


class CompositionalObjective(abc.ABC):
  """g(f(w)): `inner` maps weights and a batch to a value, `outer` maps it to a scalar.

  `outer_uses_data`: whether `outer` reads its batch (if not, a local step needs one
  batch, not two). `hparams` are extra hyperparameters the client work holds and
  broadcasts (readable and settable through the process).
  """

  outer_uses_data: bool = True
  uses_reference_loss: bool = False  # outer reads the round's reference loss c

  def hparams(self) -> dict[str, float]:
    return {}

  def reference_value(
    self, model, trainable: Weights, non_trainable: Weights, examples: Any, hparams
  ) -> tf.Tensor:
    """The loss whose largest value over a round's clients is the common reference c
    of exponential objectives: the full-data counterpart of the loss inside exp()."""
    del hparams
    return model_ops.batch_loss(model, trainable, non_trainable, examples)

  def reported_loss(
    self, model, inner_value: Any, outer_batch: Any, outer_value: tf.Tensor, hparams
  ) -> tf.Tensor:
    """The training loss a client reports for a step (default: the outer value)."""
    del model, inner_value, outer_batch, hparams
    return outer_value

  def value_spec(self, model) -> Any:
    """The TensorSpec structure of inner values f(w; B) (for trackers of f)."""
    raise NotImplementedError(f'{type(self).__name__} does not declare its inner value spec.')

  def rescale_direction(self, direction: Any, old_reference, new_reference, hparams) -> Any:
    """Re-expresses a direction computed under `old_reference` in the units of
    `new_reference` (only objectives with a reference scale change it)."""
    del old_reference, new_reference, hparams
    return direction

  @abc.abstractmethod
  def inner(self, model, trainable: Weights, non_trainable: Weights, batch: Any, hparams) -> Any:
    """f(w; B)."""

  @abc.abstractmethod
  def outer(self, model, value: Any, batch: Any, hparams, reference_loss: tf.Tensor) -> tf.Tensor:
    """g(value; B~), a scalar; `reference_loss` is the round's common reference c."""


def compositional_gradient(
  objective: CompositionalObjective,
  model,
  trainable: Weights,
  non_trainable: Weights,
  inner_batch: Any,
  outer_batch: Any,
  hparams,
  reference_loss: tf.Tensor,
) -> tuple[tf.Tensor, Any, Weights]:
  """(g value, inner value v = f(w; B), J f(w; B)^T grad g(v; B~)) as one VJP."""
  with tf.GradientTape() as inner_tape:
    inner_tape.watch(trainable)
    value = objective.inner(model, trainable, non_trainable, inner_batch, hparams)
  with tf.GradientTape() as outer_tape:
    outer_tape.watch(value)
    g = objective.outer(model, value, outer_batch, hparams, reference_loss)
  cotangent = outer_tape.gradient(g, value)
  gradient = inner_tape.gradient(value, trainable, output_gradients=cotangent)
  return g, value, tuple(gradient)


class DRFL(CompositionalObjective):
  """Distributionally robust FL via KL regularization (ComFedL paper).

      min_w (1/N) sum_i exp(F_i(w) / gamma),   inner = F_i(w; B) (p = 1),
                                               outer(y) = exp((y - c) / gamma)

  The step direction is exp((F_B - c)/gamma)/gamma grad F_B. c is a reference loss the
  server broadcasts each round, the same for every client, so it only rescales that
  round's step by exp(-c/gamma) and leaves the relative client weights
  exp(F_i/gamma) / sum_j exp(F_j/gamma) unchanged; it keeps exp() finite for small
  gamma and large losses (exp overflows float32 past 88). Nothing is clipped: a
  non-finite value still surfaces as divergence. ComFedL sets c to the largest loss of
  the round's clients at the broadcast model (see `client_work`).
  """

  outer_uses_data = False
  uses_reference_loss = True

  def __init__(self, gamma: float):
    if not gamma > 0:
      raise ValueError(f'gamma must be > 0, got {gamma}.')
    self.gamma = float(gamma)

  def hparams(self):
    return {'gamma': self.gamma}

  def inner(self, model, trainable, non_trainable, batch, hparams):
    del hparams
    return model_ops.batch_loss(model, trainable, non_trainable, batch)

  def outer(self, model, value, batch, hparams, reference_loss):
    del model, batch
    return tf.exp((value - reference_loss) / hparams['gamma'])

  def value_spec(self, model):
    del model
    return tf.TensorSpec([], tf.float32)

  def reported_loss(self, model, inner_value, outer_batch, outer_value, hparams):
    del model, outer_batch, outer_value, hparams
    return inner_value  # the client loss F, not exp((F - c)/gamma)

  def rescale_direction(self, direction, old_reference, new_reference, hparams):
    """Directions carry exp(-c/gamma): moving from c_old to c_new multiplies by
    exp((c_old - c_new)/gamma), exactly."""
    factor = tf.exp((old_reference - new_reference) / hparams['gamma'])
    return tf.nest.map_structure(lambda d: factor * d, direction)


class MAML(CompositionalObjective):
  """Model-agnostic meta-learning as a compositional objective (ComFedL, Local-SCGDM):

      inner y = w - alpha grad L(w; D_train)   (p = d: a weights-shaped value)
      outer L(y; D_test)

  D_train and D_test are the step's two independent batches.
  """

  def __init__(self, inner_learning_rate: float):
    if not inner_learning_rate > 0:
      raise ValueError(f'inner_learning_rate must be > 0, got {inner_learning_rate}.')
    self.inner_learning_rate = float(inner_learning_rate)

  def hparams(self):
    return {'inner_learning_rate': self.inner_learning_rate}

  def inner(self, model, trainable, non_trainable, batch, hparams):
    return model_ops.adapt(model, trainable, non_trainable, batch, hparams['inner_learning_rate'])[
      1
    ]

  def outer(self, model, value, batch, hparams, reference_loss):
    del hparams, reference_loss
    return model_ops.batch_loss(model, value, (), batch)

  def value_spec(self, model):
    return tuple(tf.TensorSpec(w.shape, tf.float32) for w in model.initial_weights[0])


class DAMAML(MAML):
  """Distribution-agnostic MAML: outer exp((L(y; D_test) - c) / gamma), the reference c
  handled as in DRFL (a common per-round scale; Local-SCGDM rescales exactly)."""

  uses_reference_loss = True

  def __init__(self, inner_learning_rate: float, gamma: float):
    super().__init__(inner_learning_rate)
    if not gamma > 0:
      raise ValueError(f'gamma must be > 0, got {gamma}.')
    self.gamma = float(gamma)

  def hparams(self):
    return {**super().hparams(), 'gamma': self.gamma}

  def outer(self, model, value, batch, hparams, reference_loss):
    loss = model_ops.batch_loss(model, value, (), batch)
    return tf.exp((loss - reference_loss) / hparams['gamma'])

  def rescale_direction(self, direction, old_reference, new_reference, hparams):
    return DRFL.rescale_direction(self, direction, old_reference, new_reference, hparams)

  def reference_value(self, model, trainable, non_trainable, examples, hparams):
    """L(w - alpha grad L(w; D); D) on all the client's examples: the adapted loss."""
    adapted = self.inner(model, trainable, non_trainable, examples, hparams)
    return model_ops.batch_loss(model, adapted, non_trainable, examples)

  def reported_loss(self, model, inner_value, outer_batch, outer_value, hparams):
    # L(y; D_test) itself: log(exp((L - c)/gamma)) underflows for clients far below c.
    del outer_value, hparams
    return model_ops.batch_loss(model, inner_value, (), outer_batch)


# Why a run of a compositional objective diverges, most often.
DIVERGENCE_HINT = (
  'with --objective=drfl or da_maml the steps carry exp(loss / gamma),'
  ' which overflows when losses are large against --gamma: try a larger'
  ' --gamma (e.g. 2) before a smaller --client_learning_rate; with maml,'
  ' try a smaller --client_learning_rate or --server_learning_rate'
)

# The objectives by name: the one list (builders annotate their option with it).
ObjectiveName = Literal['drfl', 'maml', 'da_maml']
OBJECTIVES = dict(zip(typing.get_args(ObjectiveName), (DRFL, MAML, DAMAML)))


def make_objective(
  name: str, *, gamma: float = 0.2, inner_learning_rate: float = 0.05
) -> CompositionalObjective:
  """An objective by name: 'drfl' (gamma), 'maml' (inner_learning_rate) or 'da_maml'
  (both)."""
  if name == 'drfl':
    return DRFL(gamma)
  if name == 'maml':
    return MAML(inner_learning_rate)
  if name == 'da_maml':
    return DAMAML(inner_learning_rate, gamma)
  raise ValueError(f'objective={name!r} is unknown; choose one of {sorted(OBJECTIVES)}.')
