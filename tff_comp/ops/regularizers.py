"""Regularizers psi: value, subgradient and proximal operator, in pure TensorFlow.

A regularizer acts on the model's trainable weights (a tuple of tensors) and covers
the tensors whose indices it names in `targets` (a task usually names the kernel, not
the bias). For step size t,

    prox_{t psi}(z) = argmin_w 0.5 ||w - z||^2 + t psi(w),

applied tensor by tensor (psi is separable across tensors). Client work and server
updates take a `Regularizer` as a parameter, so no block is copied per regularizer.

References: Yuan, Zaheer, Reddi. Federated Composite Optimization. ICML 2021;
Duchi, Shalev-Shwartz, Singer, Chandra. Efficient projections onto the l1-ball. ICML 2008.
"""

import abc
from collections.abc import Sequence
import dataclasses
from typing import ClassVar

import tensorflow as tf

from tff_comp.ops.model_ops import Weights


@dataclasses.dataclass(frozen=True)
class Regularizer(abc.ABC):
  """A separable regularizer over the trainable weight tensors named in `targets`.

  Attributes:
    strength: lam >= 0 (the radius rho for the ball constraints).
    targets: indices into the trainable weights this regularizer covers.
  """

  strength: float = 0.0
  targets: tuple[int, ...] = (0,)
  name: ClassVar[str] = ''

  def __post_init__(self):
    if self.strength < 0:
      raise ValueError(f'{type(self).__name__}: strength must be >= 0, got {self.strength}.')

  @abc.abstractmethod
  def tensor_value(self, w: tf.Tensor) -> tf.Tensor:
    """psi restricted to one tensor."""

  @abc.abstractmethod
  def tensor_prox(self, z: tf.Tensor, step: tf.Tensor) -> tf.Tensor:
    """prox_{step psi} on one tensor."""

  def tensor_subgradient(self, w: tf.Tensor) -> tf.Tensor:
    """A subgradient of psi on one tensor (for FedAvg-with-subgradient baselines)."""
    raise NotImplementedError(
      f'{type(self).__name__} has no subgradient (it is a constraint); use a proximal algorithm.'
    )

  @property
  def is_constraint(self) -> bool:
    return False

  def value(self, weights: Weights) -> tf.Tensor:
    """psi(weights), summed over the target tensors."""
    return tf.add_n([tf.constant(0.0)] + [self.tensor_value(weights[i]) for i in self.targets])

  def prox(self, weights: Weights, step) -> tuple[tf.Tensor, ...]:
    """prox_{step psi}(weights); tensors outside `targets` pass through."""
    step = tf.cast(step, tf.float32)
    return tuple(
      self.tensor_prox(w, step) if i in self.targets else w for i, w in enumerate(weights)
    )

  def subgradient(self, weights: Weights) -> tuple[tf.Tensor, ...]:
    """A subgradient of psi at weights (zeros outside `targets`)."""
    return tuple(
      self.tensor_subgradient(w) if i in self.targets else tf.zeros_like(w)
      for i, w in enumerate(weights)
    )

  def check_applies_to(self, shapes: Sequence[Sequence[int]]) -> None:
    """Raises ValueError when `targets` do not fit weights of these shapes."""
    for i in self.targets:
      if not 0 <= i < len(shapes):
        raise ValueError(
          f'{self.name}: target tensor {i} does not exist; the model has'
          f' {len(shapes)} trainable tensors.'
        )


@dataclasses.dataclass(frozen=True)
class NoRegularizer(Regularizer):
  """psi = 0; its prox is the identity."""

  name: ClassVar[str] = 'none'

  def tensor_value(self, w):
    return tf.constant(0.0)

  def tensor_prox(self, z, step):
    return z

  def tensor_subgradient(self, w):
    return tf.zeros_like(w)


@dataclasses.dataclass(frozen=True)
class L1(Regularizer):
  """psi(w) = lam ||w||_1; prox is soft-thresholding sign(z) max(|z| - t lam, 0)."""

  name: ClassVar[str] = 'l1'

  def tensor_value(self, w):
    return self.strength * tf.reduce_sum(tf.abs(w))

  def tensor_prox(self, z, step):
    return tf.sign(z) * tf.nn.relu(tf.abs(z) - step * self.strength)

  def tensor_subgradient(self, w):
    return self.strength * tf.sign(w)


@dataclasses.dataclass(frozen=True)
class SquaredL2(Regularizer):
  """psi(w) = 0.5 lam ||w||^2; prox is z / (1 + t lam)."""

  name: ClassVar[str] = 'l2_squared'

  def tensor_value(self, w):
    return 0.5 * self.strength * tf.reduce_sum(tf.square(w))

  def tensor_prox(self, z, step):
    return z / (1.0 + step * self.strength)

  def tensor_subgradient(self, w):
    return self.strength * w


@dataclasses.dataclass(frozen=True)
class Nuclear(Regularizer):
  """psi(W) = lam ||W||_* on matrices; prox soft-thresholds the singular values."""

  name: ClassVar[str] = 'nuclear'

  def tensor_value(self, w):
    return self.strength * tf.reduce_sum(tf.linalg.svd(w, compute_uv=False))

  def tensor_prox(self, z, step):
    s, u, v = tf.linalg.svd(z)
    s = tf.nn.relu(s - step * self.strength)
    return tf.matmul(u * s[..., None, :], v, adjoint_b=True)

  def tensor_subgradient(self, w):
    _, u, v = tf.linalg.svd(w)
    return self.strength * tf.matmul(u, v, adjoint_b=True)

  def check_applies_to(self, shapes):
    super().check_applies_to(shapes)
    for i in self.targets:
      if len(shapes[i]) != 2:
        raise ValueError(
          f'nuclear: target tensor {i} has shape {list(shapes[i])}; the'
          ' nuclear norm needs a matrix.'
        )


@dataclasses.dataclass(frozen=True)
class _Ball(Regularizer):
  """Indicator of {norm(w) <= rho} (rho = strength), per tensor: 0 inside (to a relative
  1e-5), infinite outside; its prox is the projection `project`, whatever the step."""

  @property
  def is_constraint(self):
    return True

  def norm(self, w: tf.Tensor) -> tf.Tensor:
    raise NotImplementedError

  def project(self, z: tf.Tensor) -> tf.Tensor:
    raise NotImplementedError

  def tensor_value(self, w):
    return tf.where(self.norm(w) <= self.strength * (1 + 1e-5), 0.0, float('inf'))

  def tensor_prox(self, z, step):
    del step  # A projection does not depend on the step size.
    return self.project(z)


@dataclasses.dataclass(frozen=True)
class L2Ball(_Ball):
  """Indicator of {||w||_2 <= rho}, per tensor; prox projects."""

  name: ClassVar[str] = 'l2_ball'

  def norm(self, w):
    return tf.norm(w)

  def project(self, z):
    return z * tf.minimum(1.0, self.strength / tf.maximum(tf.norm(z), 1e-30))


def simplex_threshold(v: tf.Tensor, total) -> tf.Tensor:
  """theta with sum(relu(v - theta)) = total for a vector v (sort-based; Duchi,
  Shalev-Shwartz, Singer, Chandra, ICML 2008): the simplex and L1-ball projections.
  total = 0 gives theta = max(v) (the projection onto {0})."""
  mu = tf.sort(v, direction='DESCENDING')
  cumsum = tf.cumsum(mu)
  j = tf.range(1, tf.size(v) + 1, dtype=v.dtype)
  rho = tf.maximum(tf.reduce_max(tf.where(mu - (cumsum - total) / j > 0, j, 0.0)), 1.0)
  return (tf.gather(cumsum, tf.cast(rho, tf.int32) - 1) - total) / rho


def project_l1_ball(z: tf.Tensor, radius: float) -> tf.Tensor:
  """Euclidean projection of z (any shape) onto {||w||_1 <= radius} (Duchi 2008)."""
  flat = tf.reshape(z, [-1])
  abs_z = tf.abs(flat)
  theta = simplex_threshold(abs_z, radius)
  projected = tf.sign(flat) * tf.nn.relu(abs_z - theta)
  inside = tf.reduce_sum(abs_z) <= radius
  return tf.reshape(tf.where(inside, flat, projected), tf.shape(z))


@dataclasses.dataclass(frozen=True)
class L1Ball(_Ball):
  """Indicator of {||w||_1 <= rho}, per tensor; prox projects (`project_l1_ball`)."""

  name: ClassVar[str] = 'l1_ball'

  def norm(self, w):
    return tf.reduce_sum(tf.abs(w))

  def project(self, z):
    return project_l1_ball(z, self.strength)


REGULARIZERS: dict[str, type[Regularizer]] = {
  cls.name: cls for cls in (NoRegularizer, L1, SquaredL2, Nuclear, L2Ball, L1Ball)
}


def make_regularizer(
  name: str, strength: float = 0.0, targets: tuple[int, ...] = (0,)
) -> Regularizer:
  """Builds a regularizer by name ('none', 'l1', 'l2_squared', 'nuclear', ...)."""
  if name not in REGULARIZERS:
    raise ValueError(f'regularizer={name!r} is unknown; choose one of {sorted(REGULARIZERS)}.')
  return REGULARIZERS[name](strength=strength, targets=targets)
