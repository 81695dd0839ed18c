"""An algorithm's contract, checked when it is built, in pure TF (no TFF, no runtime):
its blocks fit one another.

    server_rule.payload(reset(initialize(), W), W)  ->  client_rule.initialize accepts it
    client update U (client_rule.finalize)           ->  fits the aggregation kind
    kind.aggregate([U])                              ->  server_rule.update_spec(), and
                                                         server_rule.step accepts it

Each stage is traced once in a graph (`tf.function.get_concrete_function`), never run,
and without local steps: the update's structure is the one `finalize` gives from the
rule's initial local state (a `tf.while_loop` keeps a state's structure), so the check
costs a trace of a few small functions. TFF's composition checks the same links on its
type signatures (`tff_comp.learning_process.composer`); this one guards every runtime.
"""

from typing import Any, NamedTuple

import tensorflow as tf

from tff_comp.ops import client_round
from tff_comp.ops import rule as rule_lib
from tff_comp.ops import update_aggregation as aggregation_lib


class ContractError(ValueError):
  """An algorithm's blocks do not fit; the message names the link and both sides."""


class ModelWeights(NamedTuple):
  """A model's weights as the rules see them (TFF's ModelWeights in the TFF layer)."""

  trainable: tuple[tf.Tensor, ...]
  non_trainable: tuple[tf.Tensor, ...]


def _zeros(values) -> tuple[tf.Tensor, ...]:
  return tuple(tf.zeros(tf.shape(v), tf.as_dtype(v.dtype)) for v in values)


def _specs(structure: Any) -> Any:
  return tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape, t.dtype), structure)


def _first_line(error: Exception) -> str:
  return str(error).strip().split('\n')[0]


def _stage(link: str, fn, *args) -> Any:
  try:
    return fn(*args)
  except (TypeError, ValueError, AttributeError, KeyError, IndexError) as e:
    raise ContractError(f'{link}: {type(e).__name__}: {_first_line(e)}') from e


def _check_kind(kind: aggregation_lib.UpdateAggregation, update: Any) -> None:
  """The client update against the aggregation's `needs`: NORMALIZED needs `delta`
  and `a_norm` (FedNova's ||a_i||_1); SLOTS a `delta` beside its per-client tables."""
  fields: tuple[str, ...] = getattr(update, '_fields', ())
  missing = [name for name in kind.needs if name not in fields]
  if missing:
    raise ContractError(
      f'aggregation {kind.name!r} needs a client update with fields {list(kind.needs)}; the'
      f" client rule's update ({type(update).__name__}) has no {', '.join(missing)}."
    )


def _check_update_spec(aggregated: Any, spec: Any) -> None:
  try:
    tf.nest.assert_same_structure(aggregated, spec, check_types=False)
  except (TypeError, ValueError) as e:
    raise ContractError(
      f'the aggregated update ({type(aggregated).__name__}) does not have'
      f' the structure server_rule.update_spec() declares'
      f' ({type(spec).__name__}): {_first_line(e)}'
    ) from e
  for got, want in zip(tf.nest.flatten(aggregated), tf.nest.flatten(spec)):
    if got.dtype != want.dtype or not want.shape.is_compatible_with(got.shape):
      raise ContractError(
        f'the aggregated update holds {got.dtype.name}{got.shape.as_list()} where'
        f' server_rule.update_spec() declares {want.dtype.name}{want.shape.as_list()}.'
      )


def check(algorithm: Any) -> None:
  """Raises ContractError when `algorithm`'s blocks (an `ops.algorithm.Algorithm`) do
  not fit: the payload against the client rule's start, the update against the
  aggregation kind and the server rule's update spec and step."""
  server, rule = algorithm.server_rule, algorithm.client_rule
  trainable, non_trainable = algorithm.model.initial_weights

  def round_of_one_client():
    weights = ModelWeights(_zeros(trainable), _zeros(non_trainable))
    state = _stage('server_rule.reset/initialize', server.reset, server.initialize(), weights)
    payload = _stage('server_rule.payload', server.payload, state, weights)
    hparams = {k: tf.constant(v, tf.float32) for k, v in rule.initial_hparams().items()}
    context = rule_lib.RoundContext.of()
    local = _stage(
      f'the payload ({type(payload).__name__}) against {type(rule).__name__}.initialize/start',
      rule.initialize,
      payload,
      hparams,
      context,
    )
    output = _stage(
      f'{type(rule).__name__}.finalize',
      client_round.finish_client,
      rule,
      local,
      tf.constant(0),
      payload,
      hparams,
      context,
      algorithm.client_options,
      tf.constant(1),
    )
    _check_kind(algorithm.aggregation, output.update)
    stacked = tf.nest.map_structure(lambda t: t[None], output.update)
    aggregated = _stage(
      f'aggregation {algorithm.aggregation.name!r}',
      algorithm.aggregation.aggregate,
      stacked,
      output.weight[None],
    )
    _check_update_spec(_specs(aggregated), server.update_spec())
    _stage('server_rule.step', server.step, state, weights, aggregated)
    return tf.constant(0)

  tf.function(round_of_one_client, autograph=False).get_concrete_function()


def payload_spec(algorithm: Any) -> Any:
  """The structure and shapes of what `algorithm`'s server broadcasts (traced, not run)."""
  server = algorithm.server_rule
  trainable, non_trainable = algorithm.model.initial_weights

  def payload():
    weights = ModelWeights(_zeros(trainable), _zeros(non_trainable))
    return server.payload(server.reset(server.initialize(), weights), weights)

  return _specs(tf.function(payload, autograph=False).get_concrete_function().structured_outputs)
