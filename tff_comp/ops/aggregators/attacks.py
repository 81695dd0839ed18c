"""Byzantine clients, simulated as the first stage of a chain: each client of a round is
an attacker with probability `fraction`, drawn statelessly from (run seed, round,
client), and sends in place of its update x_i:

    SignFlip   -x_i
    Scaled     lam x_i                      (a boosted update; lam = `scale`)
    Gaussian   N(0, sigma^2 I)              (sigma = `scale`)
    ALIE       mu - z sigma, coordinate-wise over the round's honest updates, with
               z = Phi^-1((m - s) / m), s = floor(m / 2 + 1) - f for f attackers of m
               (or a given z)
               ("A Little Is Enough", Baruch et al. 2019: small enough to pass Krum
               and the median, all attackers alike)

Measurement `byzantine_clients`: the round's attackers. ALIE reads every honest row of
the cohort (`cohort_wide`): it runs where the whole cohort's updates meet.

Each attack registers what `--attack` calls it (`registry.register_attack`), with its
settings record; `--attack=label_flip` poisons the clients' data instead of their
updates (`tff_comp.poisoning`), and is registered here with no stage.
"""

import dataclasses
from typing import Any

import tensorflow as tf

from tff_comp import registry, settings
from tff_comp.ops.aggregators import base

LABEL_FLIP = 'label_flip'


class Attack(base.Stage):
  """Byzantine updates (module docstring) from a `fraction` of clients; a subclass says
  what an attacker sends (`forge`), `scale` its parameter."""

  name = 'attack'
  randomized = True
  exact_under_xla = False  # who attacks: TensorFlow's stateless draws (the recorded runs')
  in_state = ('fraction', 'scale')

  def __init__(self, fraction: float, scale: float = 1.0, fixed: bool = False):
    if not 0 <= fraction <= 1:
      raise ValueError(f"the attackers' fraction must be in [0, 1], got {fraction}.")
    self.fraction, self.scale, self.fixed = fraction, scale, fixed
    self.by_client = fixed

  def initial_state(self) -> tf.Tensor:
    return tf.constant([self.fraction, self.scale], tf.float32)

  def forge(self, x: tf.Tensor, bad: tf.Tensor, scale: tf.Tensor, seeds: tf.Tensor) -> tf.Tensor:
    """[m, d] what each client would send as an attacker (`bad` [m]: who is)."""
    raise NotImplementedError

  def encode(self, state, x, weights, rows, seeds):
    fraction, scale = tf.unstack(state)
    # A fixed set: the draw from (run seed, client) alone, the seed's round part dropped
    # (`base.client_seeds`: round x 2^24 + the client's index).
    drawn = tf.stack([seeds[:, 0], seeds[:, 1] % 2**24], 1) if self.fixed else seeds
    draws = tf.map_fn(
      lambda seed: tf.random.stateless_uniform([], seed), drawn, fn_output_signature=tf.float32
    )
    bad = draws < fraction  # [m] whether each client (by its seed) attacks this round
    sent = self.forge(x, bad, scale, seeds)
    return base.Encoded(
      tf.where(bad[:, None], sent, x), weights, rows, {base.ATTACKERS: tf.cast(bad, tf.float32)}
    )

  def decode(self, state, y, counts, context, seed):
    return y, state, base.Measurements(byzantine_clients=counts[base.ATTACKERS])


class SignFlip(Attack):
  def forge(self, x, bad, scale, seeds):
    return -x


class Scaled(Attack):
  def forge(self, x, bad, scale, seeds):
    return scale * x


class Gaussian(Attack):
  def forge(self, x, bad, scale, seeds):
    return scale * tf.map_fn(
      lambda seed: tf.random.stateless_normal([tf.shape(x)[1]], seed),
      seeds + tf.constant([0, 7], tf.int64),
      fn_output_signature=tf.float32,
    )


class ALIE(Attack):
  """ALIE with z by the paper's formula, or a given `z` (the authors' code uses 1.5)."""

  cohort_wide = True

  def __init__(
    self, fraction: float, scale: float = 1.0, fixed: bool = False, z: float | None = None
  ):
    super().__init__(fraction, scale, fixed)
    self.z = z

  def forge(self, x, bad, scale, seeds):
    return tf.broadcast_to(_little_is_enough(x, bad, self.z)[None, :], tf.shape(x))


def honest_moments(x: tf.Tensor, bad: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
  """([d] mean, [d] standard deviation) of the honest rows, coordinate-wise."""
  honest = tf.cast(tf.logical_not(bad), tf.float32)[:, None]
  count = tf.maximum(tf.reduce_sum(honest), 1.0)
  mu = tf.reduce_sum(x * honest, 0) / count
  return mu, tf.sqrt(tf.reduce_sum(tf.square(x - mu) * honest, 0) / count)


def _little_is_enough(x: tf.Tensor, bad: tf.Tensor, z: float | None = None) -> tf.Tensor:
  """ALIE's row: mu - z sigma over the honest rows, z by the formula unless given
  (module docstring)."""
  mu, sigma = honest_moments(x, bad)
  if z is not None:
    return mu - z * sigma
  m = tf.cast(tf.shape(x)[0], tf.float32)
  f = tf.reduce_sum(tf.cast(bad, tf.float32))
  s = tf.floor(m / 2 + 1) - f
  p = tf.clip_by_value((m - s) / m, 1e-6, 1 - 1e-6)
  z = tf.sqrt(2.0) * tf.math.erfinv(2 * p - 1)
  return mu - z * sigma


def attack_fixed() -> Any:
  """The setting of a fixed set of attackers, which every update attack declares."""
  return settings.setting(
    False,
    'a fixed set of clients attacks, each drawn once from (seed, client), not anew every'
    " round (the papers' setting; in-process runtimes and Ray).",
  )


def attack_fraction() -> Any:
  """The setting of the chance that a client attacks, which every attack declares."""
  return settings.setting(
    0.1,
    'the chance that a client is an attacker.',
    lower=0.0,
    upper=1.0,
    per_trial=True,
    chain_state=True,
  )


@dataclasses.dataclass(frozen=True)
class AttackOptions:
  attack_fraction: float = attack_fraction()
  attack_fixed: bool = attack_fixed()


@dataclasses.dataclass(frozen=True)
class LabelFlipOptions:
  attack_fraction: float = attack_fraction()


@dataclasses.dataclass(frozen=True)
class ScaledAttackOptions:
  attack_fraction: float = attack_fraction()
  attack_fixed: bool = attack_fixed()
  attack_scale: float = settings.setting(
    1.0,
    "the factor (scaled) or the noise's std (gaussian).",
    lower=settings.FLOAT32_TINY,
    upper=settings.FLOAT32_HUGE,
    per_trial=True,
    chain_state=True,
  )


@registry.register_attack('sign_flip', options=AttackOptions)
def _sign_flip(options: AttackOptions, clients_per_round: int) -> SignFlip:
  """Each attacker sends -u."""
  del clients_per_round
  return SignFlip(options.attack_fraction, fixed=options.attack_fixed)


@registry.register_attack('scaled', options=ScaledAttackOptions)
def _scaled(options: ScaledAttackOptions, clients_per_round: int) -> Scaled:
  """Each attacker sends --attack_scale x u."""
  del clients_per_round
  return Scaled(options.attack_fraction, options.attack_scale, options.attack_fixed)


@registry.register_attack('gaussian', options=ScaledAttackOptions)
def _gaussian(options: ScaledAttackOptions, clients_per_round: int) -> Gaussian:
  """Each attacker sends N(0, --attack_scale^2)."""
  del clients_per_round
  return Gaussian(options.attack_fraction, options.attack_scale, options.attack_fixed)


@dataclasses.dataclass(frozen=True)
class ALIEOptions:
  attack_fraction: float = attack_fraction()
  attack_fixed: bool = attack_fixed()
  alie_z: float | None = settings.setting(
    None,
    "z of mu - z sigma (default: the paper's formula from m and f; the authors' code uses 1.5).",
    lower=0.0,
    upper=settings.FLOAT32_HUGE,
  )


@registry.register_attack('alie', options=ALIEOptions)
def _alie(options: ALIEOptions, clients_per_round: int) -> ALIE:
  """The attackers send mu - z sigma of the honest updates ("A Little Is Enough")."""
  del clients_per_round
  return ALIE(options.attack_fraction, fixed=options.attack_fixed, z=options.alie_z)


@registry.register_attack(LABEL_FLIP, options=LabelFlipOptions)
def _label_flip(options: LabelFlipOptions, clients_per_round: int) -> None:
  """A fixed set of clients, drawn from (data seed, client), trains on labels C - 1 - y
  (their data poisoned, `tff_comp.poisoning`; no stage)."""
  del options, clients_per_round
