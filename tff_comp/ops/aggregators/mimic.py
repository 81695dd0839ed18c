"""The mimic attack (Karimireddy, He and Jaggi, ICLR 2022, "Byzantine-Robust Learning on
Heterogeneous Datasets via Bucketing", section 4): every attacker sends a copy of one
honest client's update x_{i*}, which over-represents that client's data without ever
leaving the honest updates' range, so no robust rule can reject it; under heterogeneity
that alone biases the aggregate. i* is the honest client farthest along the direction
the honest updates vary most:

    mu = mean of the honest rows,  z = top eigenvector of sum_i (x_i - mu)(x_i - mu)^T,
    i* = argmax over honest i of |<x_i - mu, z>|.

The authors estimate z once, over a warm-up of rounds with the same workers every
round; a sampled cohort changes every round, so here z is the round's own, found by
`POWER_STEPS` power iterations from a fixed random start (their code's seed-0 start).
Their argmax of <x_i, z> takes the end of z's axis its random sign points to; the
absolute value takes the farther end, which does not depend on that sign.
It reads the honest rows of the whole cohort (`cohort_wide`), as ALIE does.
"""

import dataclasses

import tensorflow as tf

from tff_comp import registry
from tff_comp.ops.aggregators import attacks

POWER_STEPS = 20


class Mimic(attacks.Attack):
  """Mimic (module docstring) from a `fraction` of clients."""

  cohort_wide = True

  def forge(self, x, bad, scale, seeds):
    return tf.broadcast_to(x[_target(x, bad)][None, :], tf.shape(x))


def _target(x: tf.Tensor, bad: tf.Tensor) -> tf.Tensor:
  """i*: the honest row farthest from their mean along their top principal direction."""
  mu, _ = attacks.honest_moments(x, bad)
  honest = tf.logical_not(bad)
  centered = tf.where(honest[:, None], x - mu, tf.zeros_like(x))
  z = tf.random.stateless_normal([tf.shape(x)[1]], [0, 0])
  for _ in range(POWER_STEPS):  # z <- C^T C z / ||C^T C z||
    z = tf.linalg.matvec(centered, tf.linalg.matvec(centered, z), transpose_a=True)
    z = z / tf.maximum(tf.norm(z), 1e-30)
  along = tf.abs(tf.linalg.matvec(centered, z))
  return tf.argmax(tf.where(honest, along, tf.fill(tf.shape(along), -1.0)))


@dataclasses.dataclass(frozen=True)
class MimicOptions:
  attack_fraction: float = attacks.attack_fraction()
  attack_fixed: bool = attacks.attack_fixed()


@registry.register_attack('mimic', options=MimicOptions)
def _mimic(options: MimicOptions, clients_per_round: int) -> Mimic:
  """The attackers copy the honest update farthest along the honest updates' top
  principal direction (Karimireddy, He and Jaggi 2022)."""
  del clients_per_round
  return Mimic(options.attack_fraction, fixed=options.attack_fixed)
