"""Aggregators: `tff.aggregators` factories for client updates, placing the math of
`ops.aggregation` (`factory_for` maps each of its kinds to a factory)."""

import collections

import tensorflow_federated as tff

from tff_comp.ops import aggregation


class FedNovaFactory(tff.aggregators.WeightedAggregationFactory):
  """FedNova's normalized averaging (Wang, Liu, Liang, Joshi, Poor, NeurIPS 2020).

  Clients send `NormalizedUpdate(delta, a_norm)` (delta = eta G_i a_i, the
  pseudo-gradient, and ||a_i||_1) with weight n_i; the result is

      tau_eff * sum_i p_i delta_i / ||a_i||_1,   tau_eff = sum_i p_i ||a_i||_1,

  p_i = n_i / sum_j n_j, a structure like `delta` (so any server optimizer applies it).
  Plain averaging of delta_i instead optimizes sum_i p_i tau_i F_i / sum p_i tau_i (the
  objective inconsistency). Measurements: `tau_eff` and the inner mean's.

  Args (of the constructor):
    inner: the weighted factory computing the two means (default MeanFactory), so
      FedNova composes with TFF's clipping, DP or compression factories.
  """

  def __init__(self, inner: tff.aggregators.WeightedAggregationFactory | None = None):
    self._inner = inner or tff.aggregators.MeanFactory()

  def create(self, value_type, weight_type) -> tff.templates.AggregationProcess:
    if not (isinstance(value_type, tff.StructType) and hasattr(value_type, 'a_norm')
            and hasattr(value_type, 'delta')):
      raise TypeError(
          'FedNovaFactory aggregates NormalizedUpdate(delta, a_norm) values, got'
          f' {value_type}. Hint: wrap the client rule in ops.sgd.Normalized.')
    @tff.tensorflow.computation(value_type)
    def normalize(update):
      return aggregation.normalize(update)

    inner = self._inner.create(normalize.type_signature.result, weight_type)

    @tff.tensorflow.computation(normalize.type_signature.result)
    def rescale(means):
      return aggregation.rescale(means)

    @tff.federated_computation
    def init_fn():
      return inner.initialize()

    @tff.federated_computation(
        init_fn.type_signature.result,
        tff.FederatedType(value_type, tff.CLIENTS),
        tff.FederatedType(weight_type, tff.CLIENTS),
    )
    def next_fn(state, value, weight):
      out = inner.next(state, tff.federated_map(normalize, value), weight)
      measurements = tff.federated_zip(collections.OrderedDict(
          tau_eff=tff.federated_map(_a_norm_of, out.result), mean=out.measurements))
      return tff.templates.MeasuredProcessOutput(
          out.state, tff.federated_map(rescale, out.result), measurements)

    return tff.templates.AggregationProcess(init_fn, next_fn)


@tff.tensorflow.computation
def _a_norm_of(means):
  return means['a_norm']


class PerClientSlotsFactory(tff.aggregators.WeightedAggregationFactory):
  """Aggregates updates holding a `delta` and per-client slot fields: the weighted
  mean of `delta` (`inner`, default MeanFactory) and the plain sum of every other
  field. A client fills only its own slot (its index) of each other field, so each sum
  is the round's per-client table: AFL's and TR-MAML's loss vector, Ditto's personal
  models and visit mask. Sampled clients are distinct, so no slot is summed twice."""

  def __init__(self, inner: tff.aggregators.WeightedAggregationFactory | None = None):
    self._inner = inner or tff.aggregators.MeanFactory()

  def create(self, value_type, weight_type) -> tff.templates.AggregationProcess:
    names = [name for name, _ in tff.structure.iter_elements(value_type)] if isinstance(
        value_type, tff.StructType) else []
    if 'delta' not in names or len(names) < 2:
      raise TypeError('PerClientSlotsFactory aggregates updates with a `delta` and'
                      f' per-client slot fields, got {value_type}.')
    slots = [name for name in names if name != 'delta']  # ops.aggregation.slot_fields
    inner = self._inner.create(value_type.delta, weight_type)
    python_container = value_type.python_container

    @tff.tensorflow.computation(value_type)
    def delta_of(update):
      return update.delta

    @tff.tensorflow.computation(value_type)
    def slots_of(update):
      return collections.OrderedDict((name, getattr(update, name)) for name in slots)

    @tff.federated_computation
    def init_fn():
      return inner.initialize()

    @tff.federated_computation(
        init_fn.type_signature.result,
        tff.FederatedType(value_type, tff.CLIENTS),
        tff.FederatedType(weight_type, tff.CLIENTS),
    )
    def next_fn(state, value, weight):
      out = inner.next(state, tff.federated_map(delta_of, value), weight)
      tables = tff.federated_sum(tff.federated_map(slots_of, value))
      result = tff.federated_zip(python_container(
          delta=out.result, **{name: tables[name] for name in slots}))
      return tff.templates.MeasuredProcessOutput(out.state, result, out.measurements)

    return tff.templates.AggregationProcess(init_fn, next_fn)


def factory_for(kind: str, inner: tff.aggregators.WeightedAggregationFactory | None = None
                ) -> tff.aggregators.WeightedAggregationFactory:
  """The factory placing `ops.aggregation` kind `kind`; `inner` (default MeanFactory)
  computes its weighted means (TFF's clipping, compression or DP factories)."""
  if kind == aggregation.MEAN:
    return inner or tff.aggregators.MeanFactory()
  if kind == aggregation.NORMALIZED:
    return FedNovaFactory(inner)
  if kind == aggregation.SLOTS:
    return PerClientSlotsFactory(inner)
  raise ValueError(f'aggregation {kind!r} is unknown; choose one of {aggregation.KINDS}.')
