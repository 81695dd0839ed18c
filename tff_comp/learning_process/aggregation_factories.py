"""Aggregators: `tff.aggregators` factories for client updates, placing the math of
`ops.aggregation` (`factory_for` maps each of its kinds to a factory).

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

import tensorflow_federated as tff

from tff_comp.learning_process import chain_factory
from tff_comp.ops import aggregation, aggregators, privacy

Factory = tff.aggregators.WeightedAggregationFactory | tff.aggregators.UnweightedAggregationFactory


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
  """Aggregates one `ops.aggregation` kind's updates (see the module docstring):

      MEAN        delta by `inner`; side channels by the exact weighted mean
      NORMALIZED  FedNova: tau_eff sum_i p_i delta_i / ||a_i||_1 with the normalized
                  deltas by `inner` and tau_eff = sum_i p_i ||a_i||_1 exact
                  (measurement `tau_eff`)
      SLOTS       delta by `inner`; every other field (a client fills its own slot) by
                  the plain sum: AFL's and TR-MAML's losses, Ditto's personal models.
                  Sampled clients are distinct, so no slot is summed twice.

  The result has the update's structure (NORMALIZED: the delta's). Measurements: the
  inner factory's (and `tau_eff`).
  """

  def __init__(self, kind: str, inner: Factory | None = None):
    if kind not in aggregation.KINDS:
      raise ValueError(f'aggregation {kind!r} is unknown; choose one of {aggregation.KINDS}.')
    self._kind, self._inner = kind, _weighted(inner)

  def create(self, value_type, weight_type) -> tff.templates.AggregationProcess:
    names = (
      [name for name, _ in tff.structure.iter_elements(value_type)]
      if isinstance(value_type, tff.StructType)
      else []
    )
    if 'delta' not in names:
      if self._kind != aggregation.MEAN:
        raise TypeError(
          f'{self._kind} aggregation needs updates with a `delta` field, got {value_type}.'
        )
      return self._inner.create(value_type, weight_type)
    if self._kind == aggregation.NORMALIZED and 'a_norm' not in names:
      raise TypeError(
        'FedNova aggregates NormalizedUpdate(delta, a_norm) values, got'
        f' {value_type}. Hint: wrap the client rule in ops.sgd.NormalizedSGD.'
      )
    sides = [name for name in names if name != 'delta']
    normalized = self._kind == aggregation.NORMALIZED
    container = value_type.python_container

    @tff.tensorflow.computation(value_type)
    def split(update):
      delta = aggregation.normalize(update)['normalized'] if normalized else update.delta
      return delta, collections.OrderedDict((n, getattr(update, n)) for n in sides)

    delta_type, side_type = split.type_signature.result
    inner = self._inner.create(delta_type, weight_type)
    if self._kind == aggregation.SLOTS:
      side = tff.aggregators.SumFactory().create(side_type)
    else:
      side = tff.aggregators.MeanFactory(no_nan_division=True).create(side_type, weight_type)

    @tff.tensorflow.computation(delta_type, side_type)
    def join(delta, sides_mean):
      if normalized:
        return aggregation.rescale(
          collections.OrderedDict(normalized=delta, a_norm=sides_mean['a_norm'])
        )
      return container(delta=delta, **sides_mean)

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
      if self._kind == aggregation.SLOTS:
        side_out = side.next(state[1], parts[1])
      else:
        side_out = side.next(state[1], parts[1], weight)
      measurements = collections.OrderedDict(mean=delta_out.measurements)
      if normalized:
        measurements['tau_eff'] = tff.federated_map(_a_norm_of, side_out.result)
      return tff.templates.MeasuredProcessOutput(
        tff.federated_zip((delta_out.state, side_out.state)),
        tff.federated_map(join, (delta_out.result, side_out.result)),
        tff.federated_zip(measurements),
      )

    return tff.templates.AggregationProcess(init_fn, next_fn)


@tff.tensorflow.computation
def _a_norm_of(means):
  return means['a_norm']


def privacy_factory(spec: privacy.PrivateMean) -> Factory:
  """TFF's factory computing `spec` (see `ops.privacy`; TFF draws its own noise)."""
  if spec.kind == privacy.CLIP:
    return tff.aggregators.clipping_factory(spec.clip_norm, tff.aggregators.MeanFactory())
  dp = tff.aggregators.DifferentiallyPrivateFactory
  if spec.kind == privacy.DP:
    return dp.gaussian_fixed(spec.noise_multiplier, spec.clients_per_round, spec.clip_norm)
  return dp.gaussian_adaptive(
    spec.noise_multiplier,
    spec.clients_per_round,
    initial_l2_norm_clip=spec.clip_norm,
    target_unclipped_quantile=spec.target_quantile,
    learning_rate=spec.clip_learning_rate,
    clipped_count_stddev=spec.count_stddev,
  )


def factory_for(
  kind: str,
  inner: Factory | privacy.PrivateMean | aggregators.Chain | None = None,
  *,
  seed: int = 0,
) -> tff.aggregators.WeightedAggregationFactory:
  """The factory placing `ops.aggregation` kind `kind`; `inner` (default MeanFactory)
  aggregates the model delta: a `PrivateMean` (as TFF's own factories), an
  `ops.aggregators.Chain` (`chain_factory.ChainFactory`, its draws seeded by `seed`),
  or TFF's clipping, compression or DP factories.

  Raises:
    ValueError: a chain TFF's clients cannot run (`chain_factory.why_not`).
  """
  if isinstance(inner, privacy.PrivateMean):
    inner = privacy_factory(inner)
  elif isinstance(inner, aggregators.Chain):
    inner = chain_factory.ChainFactory(inner, seed)
  return UpdateFactory(kind, inner)
