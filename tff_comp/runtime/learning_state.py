"""A round's state on the in-process runtimes (in-process, Ray, buffered async, batched
trials): TFF's `LearningAlgorithmState` (`base.State`), made, read and changed here."""

import collections
from typing import Any, NamedTuple

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_comp.ops import algorithm as algorithm_lib
from tff_comp.ops import client_round
from tff_comp.runtime import base, nested


def initial_state(algorithm: algorithm_lib.Algorithm, device: str, population: int) -> base.State:
  """The state a run of `algorithm` on `population` clients starts from, on `device`."""
  trainable, non_trainable = algorithm.model.initial_weights
  with tf.device(device):
    weights = tff.learning.models.ModelWeights(
      tuple(tf.constant(w) for w in trainable), tuple(tf.constant(w) for w in non_trainable)
    )
    server_state = algorithm.server_rule.reset(algorithm.server_rule.initialize(), weights)
    hparams = collections.OrderedDict(
      (k, tf.constant(v, tf.float32)) for k, v in algorithm.client_rule.initial_hparams().items()
    )
    aggregator = initial_aggregator_state(algorithm, population)
  return assemble(
    weights, client_round.ClientWorkState(hparams, tf.constant(0)), server_state, aggregator
  )


class AggregatorState(NamedTuple):
  """A model aggregator chain's state on the in-process runtimes: the chain's
  (`ops.aggregators.ChainState`) and its clients' persistent rows [population,
  row_size] (error feedback's residuals; () without)."""

  chain: Any
  rows: Any


def initial_aggregator_state(algorithm: algorithm_lib.Algorithm, population: int) -> Any:
  """The aggregator part of a run's initial state (() without a chain)."""
  chain = algorithm.model_chain
  if chain is None:
    return ()
  rows = tf.zeros([population, chain.row_size]) if chain.row_size else ()
  return AggregatorState(chain.initial_state(), rows)


def as_tensors(state: base.State) -> base.State:
  """`state` in tensors throughout: a Python float (a TFF optimizer's initial learning
  rate) would make a round function trace again for the tensor it returns, and NumPy
  values (a restored checkpoint) would count the round in NumPy (int32 + 1 gave int64),
  which traced the round again in a resumed run's second round."""
  if all(isinstance(v, tf.Tensor) for v in tf.nest.flatten(state)):
    return state  # every round after the first: rebuilding the state would cost each one
  return tf.nest.map_structure(
    lambda v: tf.constant(v, tf.float32) if isinstance(v, float) else tf.constant(v), state
  )


def with_chain_state(state: base.State, chain_state: Any) -> base.State:
  """`state` with its aggregator chain's state replaced (`base.StartsChains`)."""
  return state._replace(aggregator=state.aggregator._replace(chain=chain_state))


def assemble(weights, work: client_round.ClientWorkState, server_state, aggregator) -> base.State:
  """The state of these parts (`base.State`'s fields; no distributor state)."""
  return tff.learning.templates.LearningAlgorithmState(
    global_model_weights=weights,
    distributor=(),
    client_work=work,
    aggregator=aggregator,
    finalizer=server_state,
  )


class WeightsReader:
  """A state's model weights in NumPy (`Runtime.get_model_weights`), through a
  `nested.Packer` made once per layout of the weights: `tf.nest.map_structure` took a
  large share of a small model's round in a loop reading the model every round."""

  def __init__(self):
    self._packers: dict[tuple, nested.Packer] = {}

  def __call__(self, state: base.State) -> Any:
    weights = state.global_model_weights
    layout = (type(weights), *((type(part), len(part)) for part in weights))
    packer = self._packers.get(layout)
    if packer is None:
      packer = self._packers[layout] = nested.Packer(weights)
    return packer.pack([np.asarray(t) for t in tf.nest.flatten(weights)])


def with_model_weights(
  algorithm: algorithm_lib.Algorithm, state: base.State, weights
) -> base.State:
  """`state` with the model `weights` (the server rule's state reset to them)."""
  return assemble(
    weights,
    state.client_work,
    algorithm.server_rule.reset(state.finalizer, weights),
    state.aggregator,
  )


def hparams(algorithm: algorithm_lib.Algorithm, state: base.State) -> collections.OrderedDict:
  """OrderedDict(client_work=..., finalizer=...) of the hyperparameters in force, NumPy,
  each in the dtype the runtime holds it: a Python float (TFF's SGDM keeps its initial
  momentum so) as float32, as `as_tensors` makes it; as float64 it came back through
  `with_hparams` and broke the optimizer's float32 step (a grid's server momentum)."""
  return tf.nest.map_structure(
    lambda v: np.float32(v) if type(v) is float else np.asarray(v),
    collections.OrderedDict(
      client_work=collections.OrderedDict(state.client_work.hparams),
      finalizer=algorithm.server_rule.get_hparams(state.finalizer),
    ),
  )


def with_hparams(algorithm: algorithm_lib.Algorithm, state: base.State, values) -> base.State:
  """`state` with the hyperparameters `values` (the structure of `hparams`).

  Raises:
    ValueError: the client rule refuses them.
  """
  algorithm.client_rule.check_hparams(values['client_work'])
  work = client_round.ClientWorkState(
    collections.OrderedDict(
      (k, tf.constant(v, tf.float32)) for k, v in values['client_work'].items()
    ),
    state.client_work.round,
  )
  return assemble(
    state.global_model_weights,
    work,
    algorithm.server_rule.set_hparams(state.finalizer, values['finalizer']),
    state.aggregator,
  )
