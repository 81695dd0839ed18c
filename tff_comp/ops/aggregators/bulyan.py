"""Bulyan (El Mhamdi, Guerraoui and Rouault, ICML 2018): Krum's selection, then a
coordinate-wise trimmed mean around the median, for at most f attackers of m clients:

    S     theta = m - 2f rows chosen one at a time, each the Krum choice (the row whose
          squared distances to its r - f - 2 nearest others, r the rows left, sum least)
          of the rows not yet chosen
    y_j   the mean of the beta = theta - 2f values of coordinate j among S closest to
          their median

The paper needs m >= 4f + 3; a smaller cohort (clients dropped) keeps at least one row in
each step (theta, beta >= 1), and with f = 0 Bulyan is the mean. Every client counts
alike; the combiner needs every row.
"""

import dataclasses

import tensorflow as tf

from tff_comp import registry
from tff_comp.ops.aggregators import base, combiners


class Bulyan(base.Combiner):
  """Bulyan for at most `byzantine` f attackers (module docstring). Measurement
  `bulyan_selected`: theta, the rows Krum's steps chose; `bulyan_clamped`: 1 in a round
  whose cohort is below the paper's 4f + 3."""

  name = 'bulyan'
  decomposable = False
  weighted = False
  selects = True
  in_state = ('byzantine',)

  def __init__(self, byzantine: int = 1):
    if byzantine < 0:
      raise ValueError(f'Bulyan needs byzantine >= 0, got {byzantine}.')
    self.byzantine = byzantine

  def initial_state(self) -> tf.Tensor:
    return tf.constant(self.byzantine, tf.int32)

  def min_rows(self) -> tuple[int, str]:
    return 4 * self.byzantine + 3, f'4 f + 3 with f = {self.byzantine}'

  def combine(self, state, values, weights):
    f = state
    m = tf.shape(values)[0]
    theta = tf.maximum(m - 2 * f, 1)
    distances = combiners.squared_distances(values)
    big = tf.fill([m, m], tf.constant(float('inf'), tf.float64))

    def choose(step, left, chosen):
      """One Krum step over the rows still `left` (a [m] mask); `chosen` [m] orders."""
      among = tf.logical_and(left[:, None], left[None, :])
      among = tf.logical_and(among, tf.logical_not(tf.eye(m, dtype=tf.bool)))
      nearest = tf.sort(tf.where(among, distances, big), axis=1)
      r = tf.reduce_sum(tf.cast(left, tf.int32))
      k = tf.maximum(r - f - 2, 1)
      finite = tf.where(tf.math.is_inf(nearest), tf.zeros_like(nearest), nearest)
      scores = tf.reduce_sum(tf.where(tf.range(m)[None, :] < k, finite, 0.0), 1)
      best = tf.argmin(tf.where(left, scores, big[0]), output_type=tf.int32)
      return (
        step + 1,
        tf.tensor_scatter_nd_update(left, [[best]], [False]),
        tf.tensor_scatter_nd_update(chosen, [[best]], [True]),
      )

    _, _, chosen = tf.while_loop(
      lambda step, *_: step < theta,
      choose,
      (tf.constant(0), tf.ones([m], tf.bool), tf.zeros([m], tf.bool)),
    )
    selected = tf.boolean_mask(values, chosen)
    beta = tf.maximum(theta - 2 * f, 1)
    median = combiners.median(combiners.nan_as_inf(selected))
    # The beta values of each coordinate nearest its median (ties by position).
    nearest = tf.argsort(tf.abs(selected - median[None, :]), axis=0, stable=True)[:beta]
    closest = tf.gather(tf.transpose(selected), tf.transpose(nearest), batch_dims=1)
    result = tf.reduce_mean(closest, 1)
    return (
      result,
      None,
      state,
      base.Measurements(
        bulyan_selected=tf.cast(theta, tf.float32),
        bulyan_clamped=tf.cast(m < 4 * f + 3, tf.float32),
        **{base.ROWS_SELECTED: tf.cast(chosen, tf.float32) / tf.cast(theta, tf.float32)},
      ),
    )


@dataclasses.dataclass(frozen=True)
class BulyanOptions:
  byzantine_clients: int = combiners.byzantine_clients()


@registry.register_combiner('bulyan', options=BulyanOptions)
def _bulyan(options: BulyanOptions, rows: int) -> Bulyan:
  """Krum's selection, then a trimmed mean around the median (m >= 4f + 3)."""
  del rows
  return Bulyan(options.byzantine_clients)
