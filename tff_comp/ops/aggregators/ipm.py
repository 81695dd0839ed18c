"""The inner-product manipulation attack (IPM; Xie, Koyejo and Gupta, UAI 2020, "Fall of
Empires: Breaking Byzantine-tolerant SGD by Inner Product Manipulation"): every attacker
sends

    -epsilon mu,   mu the mean of the round's honest updates,

so that the aggregate's inner product with the true update shrinks, and for the mean
turns negative once q epsilon > m - q (q attackers of m). Small epsilon (0.1, as
Karimireddy, He and Jaggi 2022 run it) hides the rows among the honest ones; large
epsilon overwhelms the mean. It reads the honest rows of the whole cohort
(`cohort_wide`), as ALIE does.
"""

import dataclasses

import tensorflow as tf

from tff_comp import registry, settings
from tff_comp.ops.aggregators import attacks


class InnerProductManipulation(attacks.Attack):
  """IPM (module docstring) from a `fraction` of clients, `epsilon` its scale."""

  cohort_wide = True

  def forge(self, x, bad, scale, seeds):
    mu, _ = attacks.honest_moments(x, bad)
    return tf.broadcast_to(-scale * mu[None, :], tf.shape(x))


@dataclasses.dataclass(frozen=True)
class IPMOptions:
  attack_fraction: float = attacks.attack_fraction()
  attack_fixed: bool = attacks.attack_fixed()
  ipm_epsilon: float = settings.setting(
    0.1,
    'epsilon: each attacker sends -epsilon times the mean of the honest updates.',
    lower=0.0,
    upper=settings.FLOAT32_HUGE,
    per_trial=True,
    chain_state=True,
  )


@registry.register_attack('ipm', options=IPMOptions)
def _ipm(options: IPMOptions, clients_per_round: int) -> InnerProductManipulation:
  """The attackers send -epsilon times the honest updates' mean (Xie et al. 2020)."""
  del clients_per_round
  return InnerProductManipulation(
    options.attack_fraction, options.ipm_epsilon, options.attack_fixed
  )
