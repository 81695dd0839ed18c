"""Aggregators: `tff.aggregators` factories for client updates, placing the math of
`ops.update_aggregation` (`factory_for` maps an `UpdateAggregation` to a factory).

A client update is the model delta, alone or in a NamedTuple beside side channels
(FedNova's ||a_i||_1, the composite methods' sum of eta_c, q-FFL's h_i, Local-SCGDM's
trackers, per-client slots). Only the delta is a model update: the `inner` factory
(TFF's clipping, compression or differential-privacy factories) aggregates it, and the
side channels are aggregated exactly beside it (a weighted mean, or a plain sum of
per-client slots), never clipped, noised or compressed with it.

TFF's differential-privacy factories are unweighted. An unweighted `inner` is accepted
where the algorithm's math is a uniform mean (`ops.privacy.check_uniform`): its result
is then the weighted mean's, every client's weight being 1. `privacy_factory` maps an
`ops.privacy.PrivateMean` (what the in-process runtime runs) to TFF's factory with its
semantics; an `ops.aggregators.Chain` is placed by `chain_factory`.
"""

import collections
import functools

import tensorflow_federated as tff

from tff_comp.learning_process import chain_factory
from tff_comp.ops import aggregators, privacy, update_aggregation

Factory = tff.aggregators.WeightedAggregationFactory | tff.aggregators.UnweightedAggregationFactory
# What an algorithm's builder takes as its `model_aggregator`: a block chain, a
# mechanism, or any of TFF's factories (`factory_for` places each).
ModelAggregator = Factory | privacy.PrivateMean | aggregators.Chain


class _AsWeighted(tff.aggregators.WeightedAggregationFactory):
  """An unweighted factory inside the weighted interface, for uniform client weights
  (all 1: see `ops.privacy.check_uniform`), where both means agree."""

  def __init__(self, inner: tff.aggregators.UnweightedAggregationFactory):
    self._inner = inner

  def create(self, value_type, weight_type) -> tff.templates.AggregationProcess:
    inner = self._inner.create(value_type)

    @tff.federated_computation(
      inner.initialize.type_signature.result,
      tff.FederatedType(value_type, tff.CLIENTS),
      tff.FederatedType(weight_type, tff.CLIENTS),
    )
    def next_fn(state, value, weight):
      del weight  # 1 for every client
      return inner.next(state, value)

    return tff.templates.AggregationProcess(inner.initialize, next_fn)


def _weighted(inner: Factory | None) -> tff.aggregators.WeightedAggregationFactory:
  if inner is None:  # a cohort of total weight 0 (clients without examples): update 0
    return tff.aggregators.MeanFactory(no_nan_division=True)
  if isinstance(inner, tff.aggregators.UnweightedAggregationFactory):
    return _AsWeighted(inner)
  return inner


class UpdateFactory(tff.aggregators.WeightedAggregationFactory):
  """Aggregates updates as an `ops.update_aggregation.UpdateAggregation` says (see its module
  docstring): the model part (`one_model_part`: the delta; FedNova's normalized delta)
  by `inner`, the side channels exactly beside it (per-client `slots` by the plain
  sum, a client filling its own slot; otherwise the weighted mean), joined by its
  `join` (FedNova: rescaled by tau_eff). Measurements: the inner factory's under
  `mean`, and the aggregation's `measured` side channels' means (FedNova's `tau_eff`).
  """

  def __init__(self, kind: update_aggregation.UpdateAggregation, inner: Factory | None = None):
    if not isinstance(kind, update_aggregation.UpdateAggregation):
      raise TypeError(f'aggregation {kind!r} is not an ops.update_aggregation.UpdateAggregation.')
    self._kind, self._inner = kind, _weighted(inner)

  def create(self, value_type, weight_type) -> tff.templates.AggregationProcess:
    kind = self._kind
    names = (
      [name for name, _ in tff.structure.iter_elements(value_type)]
      if isinstance(value_type, tff.StructType)
      else []
    )
    missing = [name for name in kind.needs if name not in names]
    if missing:
      raise TypeError(
        f'{kind.name} aggregation needs updates with fields {list(kind.needs)}, got'
        f' {value_type}.' + (f' Hint: {kind.hint}.' if kind.hint else '')
      )
    if 'delta' not in names:
      return self._inner.create(value_type, weight_type)
    sides = [name for name in names if name != 'delta']
    container = value_type.python_container

    @tff.tensorflow.computation(value_type)
    def split(update):
      return kind.one_model_part(update), collections.OrderedDict(
        (n, getattr(update, n)) for n in sides
      )

    delta_type, side_type = split.type_signature.result
    inner = self._inner.create(delta_type, weight_type)
    if kind.slots:
      side = tff.aggregators.SumFactory().create(side_type)
    else:
      side = tff.aggregators.MeanFactory(no_nan_division=True).create(side_type, weight_type)

    @tff.tensorflow.computation(delta_type, side_type)
    def join(delta, sides_aggregated):
      return kind.join(container, delta, sides_aggregated)

    picks = {name: _pick(field, side_type) for name, field in kind.measured}

    @tff.federated_computation
    def init_fn():
      return tff.federated_zip((inner.initialize(), side.initialize()))

    @tff.federated_computation(
      init_fn.type_signature.result,
      tff.FederatedType(value_type, tff.CLIENTS),
      tff.FederatedType(weight_type, tff.CLIENTS),
    )
    def next_fn(state, value, weight):
      parts = tff.federated_map(split, value)
      delta_out = inner.next(state[0], parts[0], weight)
      if kind.slots:
        side_out = side.next(state[1], parts[1])
      else:
        side_out = side.next(state[1], parts[1], weight)
      measurements = collections.OrderedDict(mean=delta_out.measurements)
      for name, pick in picks.items():
        measurements[name] = tff.federated_map(pick, side_out.result)
      return tff.templates.MeasuredProcessOutput(
        tff.federated_zip((delta_out.state, side_out.state)),
        tff.federated_map(join, (delta_out.result, side_out.result)),
        tff.federated_zip(measurements),
      )

    return tff.templates.AggregationProcess(init_fn, next_fn)


def _pick(field: str, side_type: tff.Type) -> tff.Computation:
  """The TF computation reading `field` of the aggregated side channels."""
  return tff.tensorflow.computation(lambda sides: sides[field], side_type)


@functools.singledispatch
def privacy_factory(spec: privacy.PrivateMean, *, seed: int = 0) -> Factory:
  """TFF's factory computing the mechanism `spec` (see `ops.privacy`; TFF draws its own
  noise), by its class: TFF's clipping factory and `DifferentiallyPrivateFactory`
  (gaussian_fixed, gaussian_adaptive) for the mechanisms TFF has; any other (DP-FTRL's
  tree, BandMF, a plugin's) places `spec`'s chain as a factory
  (`chain_factory.ChainFactory`, its noise seeded by `seed`): TFF's `tree_aggregation`
  keeps its tree in the state and restarts only with adaptive clipping, while the chain
  draws the same tree's nodes statelessly (tests/test_tree_noise.py); TFF has no
  matrix factorization mechanism."""
  return chain_factory.ChainFactory(spec.chain(), seed)


@privacy_factory.register
def _(spec: privacy.ClippedMean, *, seed: int = 0) -> Factory:
  del seed
  return tff.aggregators.clipping_factory(spec.clip_norm, tff.aggregators.MeanFactory())


@privacy_factory.register
def _(spec: privacy.GaussianMean, *, seed: int = 0) -> Factory:
  del seed
  return tff.aggregators.DifferentiallyPrivateFactory.gaussian_fixed(
    spec.noise_multiplier * spec.noise_scale, spec.clients_per_round, spec.clip_norm
  )


@privacy_factory.register
def _(spec: privacy.AdaptiveGaussianMean, *, seed: int = 0) -> Factory:
  del seed
  return tff.aggregators.DifferentiallyPrivateFactory.gaussian_adaptive(
    spec.noise_multiplier,
    spec.clients_per_round,
    initial_l2_norm_clip=spec.clip_norm,
    target_unclipped_quantile=spec.target_quantile,
    learning_rate=spec.clip_learning_rate,
    clipped_count_stddev=spec.count_stddev,
  )


def factory_for(
  kind: update_aggregation.UpdateAggregation,
  inner: ModelAggregator | None = None,
  *,
  seed: int = 0,
) -> tff.aggregators.WeightedAggregationFactory:
  """The factory placing `kind` (an `ops.update_aggregation.UpdateAggregation`); `inner`
  (default MeanFactory) aggregates the model delta: a `PrivateMean`
  (`privacy_factory`), an
  `ops.aggregators.Chain` (`chain_factory.ChainFactory`, its draws seeded by `seed`),
  or TFF's clipping, compression or DP factories.

  Raises:
    ValueError: a chain TFF's clients cannot run (`chain_factory.why_not`).
  """
  if isinstance(inner, privacy.PrivateMean):
    inner = privacy_factory(inner, seed=seed)
  elif isinstance(inner, aggregators.Chain):
    inner = chain_factory.ChainFactory(inner, seed)
  return UpdateFactory(kind, inner)
