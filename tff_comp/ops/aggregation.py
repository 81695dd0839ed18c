"""How client updates combine into the server's update, in pure TF over a cohort's
updates stacked along a leading client axis (the in-process runtime); the TFF layer's
`tff_comp.aggregators` places the same math in `tff.aggregators` factories.

    MEAN        sum_i w_i u_i / sum_i w_i                      (FedAvg, dual-state mean)
    NORMALIZED  tau_eff sum_i p_i delta_i / ||a_i||_1,  tau_eff = sum_i p_i ||a_i||_1
                (FedNova; p_i = w_i / sum_j w_j)
    SLOTS       the weighted mean of `delta`, the plain sum of every other field
                (per-client tables: AFL/TR-MAML losses, Ditto's personal models)

With `groups` (a cohort holding the clients of several trials, `runtime.trial_group`),
every sum over clients is a sum over each group's clients alone (a segment sum: a
trial's non-finite update reaches no other), and the results are stacked per group.
"""

import collections
from typing import Any, NamedTuple

import tensorflow as tf

MEAN, NORMALIZED, SLOTS = 'mean', 'normalized', 'slots'
KINDS = (MEAN, NORMALIZED, SLOTS)


class Groups(NamedTuple):
  """The group (trial) of each client of a cohort: `ids` [m] int32 in [0, count)."""

  ids: tf.Tensor
  count: int


def _per_client(values: tf.Tensor, like: tf.Tensor) -> tf.Tensor:
  """[m] values shaped to broadcast against a [m, ...] stacked leaf."""
  return tf.reshape(values, [-1] + [1] * (like.shape.rank - 1))


def _sum(stacked: tf.Tensor, groups: Groups | None) -> tf.Tensor:
  """The sum over clients (axis 0), or per group ([count, ...])."""
  if groups is None:
    return tf.reduce_sum(stacked, axis=0)
  return tf.math.unsorted_segment_sum(stacked, groups.ids, groups.count)


def group_sum(stacked: Any, groups: Groups | None = None) -> Any:
  """Every leaf summed over clients (per group with `groups`)."""
  return tf.nest.map_structure(lambda t: _sum(t, groups), stacked)


def _per_group(values: tf.Tensor, like: tf.Tensor, groups: Groups | None) -> tf.Tensor:
  """Per-group values (a scalar without groups) shaped to broadcast against `like`."""
  if groups is None:
    return values
  return tf.reshape(values, tf.concat(
      [tf.shape(values), tf.ones([like.shape.rank - values.shape.rank], tf.int32)], 0))


def weighted_mean(stacked: Any, weights: tf.Tensor, groups: Groups | None = None) -> Any:
  """sum_i w_i u_i / sum_i w_i for every leaf of a structure stacked on axis 0; 0 for a
  cohort of total weight 0 (clients without examples), as TFF's
  `MeanFactory(no_nan_division=True)`."""
  total = _sum(weights, groups)
  return tf.nest.map_structure(
      lambda u: tf.math.divide_no_nan(_sum(_per_client(weights, u) * u, groups),
                                      _per_group(total, u, groups)), stacked)


def normalize(update) -> collections.OrderedDict:
  """A FedNova update as (delta / ||a||_1, ||a||_1); `a_norm` may be a scalar or a
  structure like `delta` (broadcastable factors per leaf)."""
  a_norm = update.a_norm
  if not tf.nest.is_nested(a_norm):
    a_norm = tf.nest.map_structure(lambda _: update.a_norm, update.delta)
  return collections.OrderedDict(
      normalized=tf.nest.map_structure(tf.math.divide_no_nan, update.delta, a_norm),
      a_norm=update.a_norm)


def rescale(means, groups: Groups | None = None) -> Any:
  """tau_eff x the mean normalized delta, from the means of `normalize`'s output."""
  return tf.nest.map_structure(lambda d: _per_group(means['a_norm'], d, groups) * d,
                               means['normalized'])


def slot_fields(update) -> list[str]:
  """The per-client slot fields of an update: every field but `delta`."""
  return [name for name in update._fields if name != 'delta']


def model_part(kind: str, stacked: Any) -> Any:
  """The part of the stacked updates a model aggregator (clipping, DP) averages: the
  delta (NORMALIZED: each client's delta / ||a_i||_1), or the whole update when it has
  no `delta` field."""
  if not hasattr(stacked, 'delta'):
    return stacked
  if kind == NORMALIZED:
    return tf.nest.map_structure(
        lambda d: tf.math.divide_no_nan(d, _per_client(stacked.a_norm, d)), stacked.delta)
  return stacked.delta


def combine(kind: str, model_mean: Any, stacked: Any, weights: tf.Tensor,
            groups: Groups | None = None) -> Any:
  """The server's update from the mean of `model_part` and the side channels, which are
  aggregated exactly here (the weighted mean; SLOTS: the plain sum)."""
  if not hasattr(stacked, 'delta'):
    return model_mean
  if kind == NORMALIZED:
    return rescale(collections.OrderedDict(
        normalized=model_mean, a_norm=weighted_mean(stacked.a_norm, weights, groups)),
                   groups)
  sides = {name: getattr(stacked, name) for name in slot_fields(stacked)}
  if kind == SLOTS:
    sides = group_sum(sides, groups)
  else:
    sides = weighted_mean(sides, weights, groups)
  return type(stacked)(delta=model_mean, **sides)


def aggregate(kind: str, stacked: Any, weights: tf.Tensor,
              groups: Groups | None = None) -> Any:
  """The server's update from a cohort's stacked updates and weights (see above)."""
  if kind not in KINDS:
    raise ValueError(f'aggregation {kind!r} is unknown; choose one of {KINDS}.')
  return combine(kind, weighted_mean(model_part(kind, stacked), weights, groups), stacked,
                 weights, groups)


def measurements(kind: str, stacked: Any, weights: tf.Tensor,
                 groups: Groups | None = None) -> collections.OrderedDict:
  """What the aggregation reports besides the update: FedNova's effective steps
  tau_eff = sum_i p_i ||a_i||_1 (as TFF's aggregator reports it); else nothing."""
  if kind == NORMALIZED:
    return collections.OrderedDict(tau_eff=weighted_mean(stacked.a_norm, weights, groups))
  return collections.OrderedDict()
