"""Bucketing (Karimireddy, He and Jaggi, ICLR 2022, "Byzantine-Robust Learning on
Heterogeneous Datasets via Bucketing", Algorithm 1), a pre-aggregation: the m rows,
randomly permuted each round, are averaged in buckets of s,

    y_i = mean {x_pi(k) : (i - 1) s < k <= min(i s, m)},   i = 1 .. ceil(m / s),

and the robust combiner reads the ceil(m / s) bucket means. Averaging shrinks the honest
rows' spread (their heterogeneity) by about s while at most f buckets hold an attacker,
so Krum, the median and RFA regain the accuracy heterogeneity cost them (the paper's
Table 2). A last bucket of fewer than s rows is their mean (the authors' code). The
permutation is drawn from the round's seed by counter-based hashing (`ops.stateless`),
so every runtime draws the same one; a bucket holding a non-finite row is non-finite,
which the robust combiner handles as such.
"""

import dataclasses

import tensorflow as tf

from tff_comp import registry, settings
from tff_comp.ops import stateless
from tff_comp.ops.aggregators import base


class Bucketing(base.PreAggregation):
  """Bucketing (module docstring) in buckets of `bucket_size` s rows."""

  name = 'bucketing'

  def __init__(self, bucket_size: int):
    if bucket_size < 1:
      raise ValueError(f'bucketing needs bucket_size >= 1, got {bucket_size}.')
    self.bucket_size = bucket_size

  def rows(self, m: int) -> int:
    return -(-m // self.bucket_size)  # ceil(m / s)

  def permutation(self, m: tf.Tensor | int, seed: tf.Tensor) -> tf.Tensor:
    """[m] the round's order of the rows, from its `seed` [2]."""
    draws = stateless.row_uniform(tf.cast(seed, tf.int64)[None, :], m)[0]
    return tf.argsort(draws, stable=True)

  def mix(self, values, weights, seed):
    buckets = self._means(values, seed)
    return buckets, tf.ones([tf.shape(buckets)[0]], weights.dtype)

  def mix_marks(self, values, marks, seed):
    del values
    return self._means(marks[:, None], seed)[:, 0]

  def _means(self, rows: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
    """[ceil(m / s), d] the bucket means of `rows` [m, d] in the round's order."""
    m, s = tf.shape(rows)[0], self.bucket_size
    buckets = (m + s - 1) // s
    shuffled = tf.gather(rows, self.permutation(m, seed))
    padding = tf.zeros([buckets * s - m, tf.shape(rows)[1]], rows.dtype)
    sums = tf.reduce_sum(tf.reshape(tf.concat([shuffled, padding], 0), [buckets, s, -1]), 1)
    members = tf.minimum(s, m - s * tf.range(buckets))
    return sums / tf.cast(members, rows.dtype)[:, None]


@dataclasses.dataclass(frozen=True)
class BucketingOptions:
  bucket_size: int = settings.setting(
    2,
    'the rows s averaged in each random bucket before the robust combiner reads them.',
    lower=1,
    upper=settings.MAX_COUNT,
  )


@registry.register_pre_aggregation('bucketing', options=BucketingOptions)
def _bucketing(options: BucketingOptions, clients_per_round: int) -> Bucketing:
  """Random buckets of s rows averaged (Karimireddy, He and Jaggi 2022)."""
  del clients_per_round
  return Bucketing(options.bucket_size)
