"""Byzantine clients, simulated as the first stage of a chain: each client of a round is
an attacker with probability `fraction`, drawn statelessly from (run seed, round,
client), and sends in place of its update x_i:

    sign_flip   -x_i
    scaled      lam x_i                      (a boosted update; lam = `scale`)
    gaussian    N(0, sigma^2 I)              (sigma = `scale`)
    alie        mu - z sigma, coordinate-wise over the round's honest updates, with
                z = Phi^-1((m - s) / m), s = floor(m / 2 + 1) - f for f attackers of m
                ("A Little Is Enough", Baruch et al. 2019: small enough to pass Krum
                and the median, all attackers alike)

Measurement `byzantine_clients`: the round's attackers. ALIE reads every honest row of
the cohort (`cohort_wide`): it runs where the whole cohort's updates meet.
"""

import tensorflow as tf

from tff_comp.ops.aggregators import base

KINDS = ('sign_flip', 'scaled', 'gaussian', 'alie')


class Attack(base.Stage):
  """A `kind` of Byzantine update (module docstring) from a `fraction` of clients."""

  name = 'attack'
  randomized = True
  in_state = ('fraction', 'scale')

  def __init__(self, kind: str, fraction: float, scale: float = 1.0):
    if kind not in KINDS:
      raise ValueError(f'attack {kind!r} is unknown; choose one of {", ".join(KINDS)}.')
    if not 0 <= fraction <= 1:
      raise ValueError(f"the attackers' fraction must be in [0, 1], got {fraction}.")
    self.kind, self.fraction, self.scale = kind, fraction, scale
    self.cohort_wide = kind == 'alie'

  def initial_state(self) -> tf.Tensor:
    return tf.constant([self.fraction, self.scale], tf.float32)

  def encode(self, state, x, weights, rows, seeds):
    fraction, scale = tf.unstack(state)
    draws = tf.map_fn(
      lambda seed: tf.random.stateless_uniform([], seed), seeds, fn_output_signature=tf.float32
    )
    bad = draws < fraction  # [m] whether each client (by its seed) attacks this round
    if self.kind == 'sign_flip':
      sent = -x
    elif self.kind == 'scaled':
      sent = scale * x
    elif self.kind == 'gaussian':
      sent = scale * tf.map_fn(
        lambda seed: tf.random.stateless_normal([tf.shape(x)[1]], seed),
        seeds + tf.constant([0, 7], tf.int64),
        fn_output_signature=tf.float32,
      )
    else:
      sent = tf.broadcast_to(_little_is_enough(x, bad)[None, :], tf.shape(x))
    return base.Encoded(
      tf.where(bad[:, None], sent, x), weights, rows, {'attackers': tf.cast(bad, tf.float32)}
    )

  def decode(self, state, y, counts, context, seed):
    return y, state, base.Measurements(byzantine_clients=counts['attackers'])


def _little_is_enough(x: tf.Tensor, bad: tf.Tensor) -> tf.Tensor:
  """ALIE's row: mu - z sigma over the honest rows (module docstring)."""
  honest = tf.cast(tf.logical_not(bad), tf.float32)[:, None]
  count = tf.maximum(tf.reduce_sum(honest), 1.0)
  mu = tf.reduce_sum(x * honest, 0) / count
  sigma = tf.sqrt(tf.reduce_sum(tf.square(x - mu) * honest, 0) / count)
  m = tf.cast(tf.shape(x)[0], tf.float32)
  f = tf.reduce_sum(tf.cast(bad, tf.float32))
  s = tf.floor(m / 2 + 1) - f
  p = tf.clip_by_value((m - s) / m, 1e-6, 1 - 1e-6)
  z = tf.sqrt(2.0) * tf.math.erfinv(2 * p - 1)
  return mu - z * sigma
