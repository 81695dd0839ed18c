"""How a client update's fields combine into the server's update, in pure TF over a
cohort's updates stacked along a leading client axis (the in-process runtimes); the TFF
layer's `learning_process.aggregation_factories.UpdateFactory` places the same objects'
math in a `tff.aggregators` factory. An update is its model part (the `delta`, which an
aggregator chain may combine instead of the weighted mean) beside side channels:

    MEAN        sum_i w_i u_i / sum_i w_i, every field        (FedAvg, dual-state mean)
    NORMALIZED  tau_eff sum_i p_i delta_i / ||a_i||_1,  tau_eff = sum_i p_i ||a_i||_1
                (FedNova; p_i = w_i / sum_j w_j)
    SLOTS       the weighted mean of `delta`, the plain sum of every other field
                (per-client tables: AFL/TR-MAML losses, Ditto's personal models)

Each is an `UpdateAggregation` object whose few hooks (the model part of one update, how
the side channels add, how the parts join) define both placements, so another way of
combining updates is one subclass. Every one is computed from sums over the clients
(`sums`, then `from_sums`), so shares of a cohort summed apart (Ray's actors) and added
give the same update.
"""

import collections
import dataclasses
from typing import Any, ClassVar, NamedTuple

import tensorflow as tf


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


def slot_fields(update) -> list[str]:
  """The side channels of an update: every field but `delta`."""
  return [name for name in update._fields if name != 'delta']


class Sums(NamedTuple):
  """A share of a cohort's contribution to its aggregate, added across shares (Ray's
  actors) before `from_sums`: `update` is the update's structure holding sum_i w_i x_i
  for each field (`model_part` for the model, each side channel; SLOTS' side channels
  sum_i x_i), `weight` sum_i w_i."""

  update: Any
  weight: tf.Tensor


@dataclasses.dataclass(frozen=True)
class UpdateAggregation:
  """How an update's fields combine (module docstring); this class is MEAN's math. An
  update without a `delta` field is all model part. Subclasses override the hooks:

      needs, hint          the fields an update must have; how to give them
      one_model_part(u)    one client's model part (the delta)
      slots                side channels are per-client tables, summed (else averaged)
      join(model, sides)   the server's update from the aggregated parts
      measured             {measurement: side channel} reported from the sides' means
  """

  name = 'mean'
  needs: ClassVar[tuple[str, ...]] = ()
  hint = ''  # how to fix an update lacking a needed field
  slots = False
  measured: ClassVar[tuple[tuple[str, str], ...]] = ()

  def __repr__(self) -> str:
    return f'aggregation.{self.name.upper()}'

  def one_model_part(self, update) -> Any:
    return update.delta

  def join(self, container: type, model: Any, sides: dict[str, Any]) -> Any:
    return container(delta=model, **sides)

  def model_part(self, stacked: Any) -> Any:
    """The part of the stacked updates a model aggregator (clipping, DP, a chain)
    combines: the delta (NORMALIZED: each client's delta / ||a_i||_1), or the whole
    update when it has no `delta` field."""
    if not hasattr(stacked, 'delta'):
      return stacked
    return self._stacked_model_part(stacked)

  def _stacked_model_part(self, stacked: Any) -> Any:
    return stacked.delta

  def sums(self, stacked: Any, weights: tf.Tensor) -> Sums:
    """The cohort share's `Sums` (see `Sums`)."""

    def weighted(tree):
      return tf.nest.map_structure(
        lambda u: tf.reduce_sum(_per_client(weights, u) * u, axis=0), tree
      )

    model = weighted(self.model_part(stacked))
    if not hasattr(stacked, 'delta'):
      return Sums(model, tf.reduce_sum(weights))
    sides = {name: getattr(stacked, name) for name in slot_fields(stacked)}
    sides = (
      tf.nest.map_structure(lambda t: tf.reduce_sum(t, axis=0), sides)
      if self.slots
      else weighted(sides)
    )
    return Sums(type(stacked)(delta=model, **sides), tf.reduce_sum(weights))

  def from_sums(self, total: Sums, model_mean: Any = None) -> Any:
    """The server's update from the cohort's `Sums` (every share's added);
    `model_mean` in place of the model part's weighted mean (a chain's result)."""

    def mean(tree):
      return tf.nest.map_structure(lambda u: tf.math.divide_no_nan(u, total.weight), tree)

    update = total.update
    if not hasattr(update, 'delta'):
      return mean(update) if model_mean is None else model_mean
    model = mean(update.delta) if model_mean is None else model_mean
    sides = {name: getattr(update, name) for name in slot_fields(update)}
    return self.join(type(update), model, sides if self.slots else mean(sides))

  def measurements(self, total: Sums) -> collections.OrderedDict:
    """What the aggregation reports besides the update (`measured`: FedNova's
    effective steps tau_eff = sum_i p_i ||a_i||_1, as TFF's aggregator names it)."""
    return collections.OrderedDict(
      (name, tf.math.divide_no_nan(getattr(total.update, field), total.weight))
      for name, field in self.measured
    )

  def aggregate(self, stacked: Any, weights: tf.Tensor) -> Any:
    """The server's update from a cohort's stacked updates and weights; 0 for a cohort
    of total weight 0 (clients without examples), as TFF's
    `MeanFactory(no_nan_division=True)`."""
    return self.from_sums(self.sums(stacked, weights))


@dataclasses.dataclass(frozen=True)
class Normalized(UpdateAggregation):
  """FedNova's: the normalized deltas' weighted mean rescaled by tau_eff."""

  name = 'normalized'
  needs = ('delta', 'a_norm')
  hint = 'wrap the client rule in ops.sgd.NormalizedSGD'
  measured = (('tau_eff', 'a_norm'),)

  def one_model_part(self, update) -> Any:
    return normalize(update)['normalized']

  def _stacked_model_part(self, stacked: Any) -> Any:
    return tf.nest.map_structure(
      lambda d: tf.math.divide_no_nan(d, _per_client(stacked.a_norm, d)), stacked.delta
    )

  def join(self, container: type, model: Any, sides: dict[str, Any]) -> Any:
    del container  # the update is the rescaled delta alone
    return tf.nest.map_structure(lambda d: sides['a_norm'] * d, model)


@dataclasses.dataclass(frozen=True)
class Slots(UpdateAggregation):
  """The delta's weighted mean beside per-client tables, summed (a client fills its
  own slot; sampled clients are distinct, so none is summed twice)."""

  name = 'slots'
  needs = ('delta',)
  slots = True


MEAN, NORMALIZED, SLOTS = UpdateAggregation(), Normalized(), Slots()
