"""How client updates combine into the server's update, in pure TF over a cohort's
updates stacked along a leading client axis (the in-process runtime); the TFF layer's
`tff_comp.learning_process.aggregation_factories` places the same math in
`tff.aggregators` factories.

    MEAN        sum_i w_i u_i / sum_i w_i                      (FedAvg, dual-state mean)
    NORMALIZED  tau_eff sum_i p_i delta_i / ||a_i||_1,  tau_eff = sum_i p_i ||a_i||_1
                (FedNova; p_i = w_i / sum_j w_j)
    SLOTS       the weighted mean of `delta`, the plain sum of every other field
                (per-client tables: AFL/TR-MAML losses, Ditto's personal models)

Every kind is computed from sums over the clients (`sums`, then `from_sums`), so shares
of a cohort summed apart (Ray's actors) and added give the same update.
"""

import collections
from typing import Any, NamedTuple

import tensorflow as tf

MEAN, NORMALIZED, SLOTS = 'mean', 'normalized', 'slots'
KINDS = (MEAN, NORMALIZED, SLOTS)


def _per_client(values: tf.Tensor, like: tf.Tensor) -> tf.Tensor:
  """[m] values shaped to broadcast against a [m, ...] stacked leaf."""
  return tf.reshape(values, [-1] + [1] * (like.shape.rank - 1))


def normalize(update) -> collections.OrderedDict:
  """A FedNova update as (delta / ||a||_1, ||a||_1); `a_norm` may be a scalar or a
  structure like `delta` (broadcastable factors per leaf)."""
  a_norm = update.a_norm
  if not tf.nest.is_nested(a_norm):
    a_norm = tf.nest.map_structure(lambda _: update.a_norm, update.delta)
  return collections.OrderedDict(
    normalized=tf.nest.map_structure(tf.math.divide_no_nan, update.delta, a_norm),
    a_norm=update.a_norm,
  )


def rescale(means) -> Any:
  """tau_eff x the mean normalized delta, from the means of `normalize`'s output."""
  return tf.nest.map_structure(lambda d: means['a_norm'] * d, means['normalized'])


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
      lambda d: tf.math.divide_no_nan(d, _per_client(stacked.a_norm, d)), stacked.delta
    )
  return stacked.delta


class Sums(NamedTuple):
  """A share of a cohort's contribution to its aggregate, added across shares (Ray's
  actors) before `from_sums`: `update` is the update's structure holding sum_i w_i x_i
  for each field (`model_part` for the model, each side channel; SLOTS' side channels
  sum_i x_i), `weight` sum_i w_i."""

  update: Any
  weight: tf.Tensor


def sums(kind: str, stacked: Any, weights: tf.Tensor) -> Sums:
  """The cohort share's `Sums` (see above)."""

  def weighted(tree):
    return tf.nest.map_structure(lambda u: tf.reduce_sum(_per_client(weights, u) * u, axis=0), tree)

  model = weighted(model_part(kind, stacked))
  if not hasattr(stacked, 'delta'):
    update = model
  elif kind == NORMALIZED:
    update = type(stacked)(delta=model, a_norm=weighted(stacked.a_norm))
  else:
    sides = {name: getattr(stacked, name) for name in slot_fields(stacked)}
    sides = (
      tf.nest.map_structure(lambda t: tf.reduce_sum(t, axis=0), sides)
      if kind == SLOTS
      else weighted(sides)
    )
    update = type(stacked)(delta=model, **sides)
  return Sums(update, tf.reduce_sum(weights))


def from_sums(kind: str, total: Sums, model_mean: Any = None) -> Any:
  """`aggregate`'s update from the cohort's `Sums` (every share's added); `model_mean`
  in place of the model part's weighted mean (a private aggregator's)."""

  def mean(tree):
    return tf.nest.map_structure(lambda u: tf.math.divide_no_nan(u, total.weight), tree)

  update = total.update
  if not hasattr(update, 'delta'):
    return mean(update) if model_mean is None else model_mean
  model = mean(update.delta) if model_mean is None else model_mean
  if kind == NORMALIZED:
    return rescale(collections.OrderedDict(normalized=model, a_norm=mean(update.a_norm)))
  sides = {name: getattr(update, name) for name in slot_fields(update)}
  return type(update)(delta=model, **(sides if kind == SLOTS else mean(sides)))


def measurements(kind: str, total: Sums) -> collections.OrderedDict:
  """What the aggregation reports besides the update: FedNova's effective steps
  tau_eff = sum_i p_i ||a_i||_1 (as TFF's aggregator reports it); else nothing."""
  if kind == NORMALIZED:
    return collections.OrderedDict(tau_eff=tf.math.divide_no_nan(total.update.a_norm, total.weight))
  return collections.OrderedDict()


def aggregate(kind: str, stacked: Any, weights: tf.Tensor) -> Any:
  """The server's update from a cohort's stacked updates and weights (see above); 0 for
  a cohort of total weight 0 (clients without examples), as TFF's
  `MeanFactory(no_nan_division=True)`."""
  if kind not in KINDS:
    raise ValueError(f'aggregation {kind!r} is unknown; choose one of {KINDS}.')
  return from_sums(kind, sums(kind, stacked, weights))
