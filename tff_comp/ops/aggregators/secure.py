"""Secure aggregation as TFF's `secure_aggregator` computes it (Bonawitz et al. 2017;
`tff.federated_secure_sum_bitwidth`), simulated: the server learns the sum alone.

    SecureSum(r, b, B)   each client's v_i = w_i x_i (or x_i, unweighted) clipped to
                         [-r, r] per coordinate and mapped to integers,
                         q_i = round((v_i + r) (2^b - 1) / (2 r)); the server gets
                         S = sum_i q_i mod 2^B and decodes sum_i v_i = S 2r / (2^b - 1) - m r,
                         then divides by sum_i w_i (or m)

B defaults to b + ceil(log2 of the largest cohort), which never wraps; a smaller B (what a
deployment chooses to save bits) wraps where sum_i q_i >= 2^B, and `secure_wrapped`
counts the coordinates that did (a diagnostic the simulation can compute because it
sees the exact sum; a real server could not). Dropped clients are simply not summed (the
protocol recovers their masks). With b = 32, S / (2^32 - 1) is TFF's float secure sum's
quantization. Each client sends B bits a coordinate.
"""

import math
from typing import NamedTuple

import tensorflow as tf

from tff_comp.ops.aggregators import base


class SecureSums(NamedTuple):
  """A share's sum of its clients' integers (the server sees it modulo 2^B; the exact
  sum is the wrap diagnostic), its weight and clients, and its clients' coordinates
  clipped above and below."""

  exact: tf.Tensor
  weight: tf.Tensor
  clients: tf.Tensor
  upper_clipped: tf.Tensor
  lower_clipped: tf.Tensor


class SecureSum(base.Combiner):
  """The secure (weighted) mean of the module docstring, with bound `bound` r, `bits`
  b per value and `sum_bits` B (None: b + ceil(log2 `max_clients`))."""

  name = 'secure_sum'
  scaled_sum = True

  def __init__(
    self,
    bound: float,
    bits: int = 20,
    sum_bits: int | None = None,
    max_clients: int = 1024,
    weighted: bool = True,
  ):
    if not bound > 0:
      raise ValueError(f"the secure sum's bound must be > 0, got {bound}.")
    if not 1 <= bits <= 32:
      raise ValueError(f'the secure sum takes 1 to 32 bits a value, got {bits}.')
    self.bound, self.bits, self.weighted = bound, bits, weighted
    self.sum_bits = sum_bits or bits + math.ceil(math.log2(max(max_clients, 2)))
    if not bits <= self.sum_bits <= 62:
      raise ValueError(f"the secure sum's modulus takes {bits} to 62 bits, got {self.sum_bits}.")

  def _levels(self) -> float:
    return float(2**self.bits - 1)

  def sums(self, state, values, weights) -> SecureSums:
    v = values * weights[:, None] if self.weighted else values
    r = self.bound
    q = tf.cast(tf.round((tf.clip_by_value(v, -r, r) + r) * (self._levels() / (2 * r))), tf.int64)
    return SecureSums(
      tf.reduce_sum(q, 0),
      tf.reduce_sum(weights),
      tf.cast(tf.shape(values)[0], tf.float32),
      tf.reduce_sum(tf.cast(v > r, tf.int32)),
      tf.reduce_sum(tf.cast(v < -r, tf.int32)),
    )

  def from_sums(self, state, total: SecureSums):
    modulus = 2**self.sum_bits
    modular = tf.math.floormod(total.exact, modulus)  # what the protocol reveals
    r = self.bound
    summed = (
      tf.cast(modular, tf.float64) * (2 * r / self._levels())
      - tf.cast(total.clients, tf.float64) * r
    )
    denominator = total.weight if self.weighted else total.clients
    scale = tf.math.divide_no_nan(1.0, denominator)
    measurements = base.Measurements(
      secure_upper_clipped_count=total.upper_clipped,
      secure_lower_clipped_count=total.lower_clipped,
      secure_upper_threshold=tf.constant(r, tf.float32),
      secure_lower_threshold=tf.constant(-r, tf.float32),
      secure_bits=tf.constant(float(self.sum_bits)),
      secure_wrapped=tf.reduce_sum(tf.cast(total.exact >= modulus, tf.float32)),
    )
    return tf.cast(summed, tf.float32) * scale, scale, state, measurements

  def upload_bits(self, d: int, bits: float) -> float:
    del bits
    return float(self.sum_bits) * d
