"""Composes building blocks into a `tff.learning.templates.LearningProcess`.

    ┌ server state: LearningAlgorithmState(global_model_weights W, distributor,
    │               client_work, aggregator, finalizer)
    ├ client_payload(finalizer state, W) -> P          (server_update.client_payload)
    ├ distributor.next(P@SERVER) -> P@CLIENTS           (broadcast)
    ├ client_work.next(P@CLIENTS, data@CLIENTS) -> ClientResult(U, weight)@CLIENTS
    ├ aggregator.next(U, weight) -> U@SERVER            (a tff.aggregators factory)
    └ server_update.next(finalizer state, W, U) -> W'   (a ServerUpdateProcess)

This generalizes TFF's `compose_learning_process`, whose distributor sees only the
model: here the server update decides what clients receive, so algorithms that keep a
dual state, trackers or momentum on the server compose from the same blocks. The
result is a genuine LearningProcess: `tff.simulation.run_training_process`,
`compose_dataset_computation_with_learning_process` and checkpointing accept it;
`get_model_weights` returns the model to evaluate (the primal for dual averaging).
A server update that keeps personal models (Ditto) yields a
`PersonalizedLearningProcess`, which also has `get_personal_weights`.

`compose(algorithm)` builds the blocks of an `ops.algorithm.Algorithm` (the math every
runtime runs) and composes them; its process remembers the algorithm (`.algorithm`).
"""

import collections
from typing import Any

import tensorflow_federated as tff

from tff_comp.learning_process import aggregation_factories
from tff_comp.learning_process import client_work as client_work_lib
from tff_comp.learning_process import server_update as server_update_lib
from tff_comp.ops import algorithm as algorithm_lib
from tff_comp.ops import privacy


class ComposedLearningProcess(tff.learning.templates.LearningProcess):
  """A LearningProcess that remembers the `ops.algorithm.Algorithm` it places (None
  when composed from hand-built blocks)."""

  def __init__(self, *args, algorithm: algorithm_lib.Algorithm | None = None, **kwargs):
    super().__init__(*args, **kwargs)
    self.algorithm = algorithm


class PersonalizedLearningProcess(ComposedLearningProcess):
  """A LearningProcess whose state also holds one personal model per client (Ditto).

  `get_personal_weights`: (state -> tuple of [num_clients, *shape] tensors, one per
  trainable tensor); row i is the personal model of the client with index i.
  """

  def __init__(self, *args, get_personal_weights_fn: tff.Computation, **kwargs):
    super().__init__(*args, **kwargs)
    self._get_personal_weights_fn = get_personal_weights_fn

  @property
  def get_personal_weights(self) -> tff.Computation:
    return self._get_personal_weights_fn


class CompositionError(TypeError):
  """Two blocks do not fit together; the message names both and the types."""


def _check_link(producer: str, produced, consumer: str, expected, hint: str):
  if not expected.is_assignable_from(produced):
    raise CompositionError(
      f'{producer} produces\n  {produced}\nbut {consumer} expects\n  {expected}\nHint: {hint}'
    )


def compose_learning_process(
  *,
  initial_model_weights_fn: tff.Computation,
  client_work: tff.learning.templates.ClientWorkProcess,
  aggregator: tff.aggregators.WeightedAggregationFactory,
  server_update: server_update_lib.ServerUpdateProcess,
  algorithm: algorithm_lib.Algorithm | None = None,
) -> ComposedLearningProcess:
  """Builds a LearningProcess from blocks; see the module docstring for the flow.

  Args:
    initial_model_weights_fn: no-arg TF computation returning ModelWeights.
    client_work: a ClientWorkProcess taking the server update's payload.
    aggregator: a weighted `tff.aggregators` factory, created here for the client
      work's update type.
    server_update: a ServerUpdateProcess accepting the aggregated update.
    algorithm: the Algorithm these blocks place, if any (kept on the process).

  Returns:
    A `tff.learning.templates.LearningProcess` (a `PersonalizedLearningProcess` when
    the server update keeps personal models).

  Raises:
    CompositionError: a block's output does not fit the next block's input.
  """
  if not isinstance(server_update, server_update_lib.ServerUpdateProcess):
    raise CompositionError(
      f'server_update must be a ServerUpdateProcess, got {type(server_update)}.'
      ' Hint: wrap a TFF finalizer with server_update.from_finalizer.'
    )
  if not isinstance(aggregator, tff.aggregators.WeightedAggregationFactory):
    raise CompositionError(
      f'aggregator must be a weighted tff.aggregators factory, got'
      f' {type(aggregator).__name__}. Hint: client work weighs updates;'
      ' use tff.aggregators.MeanFactory() (uniform weighting is a client'
      ' work option).'
    )
  weights_type = initial_model_weights_fn.type_signature.result
  payload_fn = server_update.client_payload
  payload_type = payload_fn.type_signature.result
  _check_link(
    'initial_model_weights_fn',
    weights_type,
    'server_update.client_payload',
    payload_fn.type_signature.parameter[1],
    'the server update was built for a different model.',
  )
  work_param = client_work.next.type_signature.parameter
  _check_link(
    'server_update.client_payload',
    payload_type,
    'client_work',
    work_param[1].member,
    'the client update rule and the server update must agree on what the'
    ' server broadcasts (model weights, or a DualPayload for dual averaging).',
  )
  client_result = client_work.next.type_signature.result.result.member
  update_type = client_result.update
  try:
    aggregation = aggregator.create(update_type, client_result.update_weight)
  except (TypeError, ValueError) as e:
    raise CompositionError(
      f'aggregator {type(aggregator).__name__} cannot aggregate client_work'
      f' updates of type\n  {update_type}\n({e})'
    ) from e
  _check_link(
    'aggregator',
    aggregation.next.type_signature.result.result.member,
    'server_update',
    server_update.next.type_signature.parameter[2].member,
    'the client update rule and the server update disagree on the update'
    ' (for example an ElapsedUpdate with lr_sum versus a plain model delta).',
  )
  distributor = tff.learning.templates.build_broadcast_process(payload_type)

  @tff.federated_computation
  def init_fn():
    weights = tff.federated_eval(initial_model_weights_fn, tff.SERVER)
    server_state = tff.federated_map(server_update.reset, (server_update.initialize(), weights))
    return tff.federated_zip(
      tff.learning.templates.LearningAlgorithmState(
        weights,
        distributor.initialize(),
        client_work.initialize(),
        aggregation.initialize(),
        server_state,
      )
    )

  state_type = init_fn.type_signature.result

  @tff.federated_computation(state_type, work_param[2])
  def next_fn(state, client_data):
    payload = tff.federated_map(payload_fn, (state.finalizer, state.global_model_weights))
    distributed = distributor.next(state.distributor, payload)
    work = client_work.next(state.client_work, distributed.result, client_data)
    aggregated = aggregation.next(state.aggregator, work.result.update, work.result.update_weight)
    finalized = server_update.next(state.finalizer, state.global_model_weights, aggregated.result)
    new_state = tff.federated_zip(
      tff.learning.templates.LearningAlgorithmState(
        finalized.result,
        distributed.state,
        work.state,
        aggregated.state,
        finalized.state,
      )
    )
    metrics = tff.federated_zip(
      collections.OrderedDict(
        distributor=distributed.measurements,
        client_work=work.measurements,
        aggregator=aggregated.measurements,
        finalizer=finalized.measurements,
      )
    )
    return tff.learning.templates.LearningProcessOutput(new_state, metrics)

  member_type = state_type.member

  @tff.tensorflow.computation(member_type)
  def get_model_weights(state):
    return state.global_model_weights

  @tff.tensorflow.computation(member_type, member_type.global_model_weights)
  def set_model_weights(state, weights):
    return tff.learning.templates.LearningAlgorithmState(
      weights,
      state.distributor,
      state.client_work,
      state.aggregator,
      server_update.reset(state.finalizer, weights),
    )

  @tff.tensorflow.computation(member_type)
  def get_hparams(state):
    return collections.OrderedDict(
      client_work=client_work.get_hparams(state.client_work),
      finalizer=server_update.get_hparams(state.finalizer),
    )

  @tff.tensorflow.computation(member_type, get_hparams.type_signature.result)
  def set_hparams(state, hparams):
    return tff.learning.templates.LearningAlgorithmState(
      state.global_model_weights,
      state.distributor,
      client_work.set_hparams(state.client_work, hparams['client_work']),
      state.aggregator,
      server_update.set_hparams(state.finalizer, hparams['finalizer']),
    )

  args = (init_fn, next_fn, get_model_weights, set_model_weights)
  kwargs = dict(get_hparams_fn=get_hparams, set_hparams_fn=set_hparams, algorithm=algorithm)
  if server_update.personal_weights is None:
    return ComposedLearningProcess(*args, **kwargs)

  @tff.tensorflow.computation(member_type)
  def get_personal_weights(state):
    return server_update.personal_weights(state.finalizer)

  return PersonalizedLearningProcess(*args, **kwargs, get_personal_weights_fn=get_personal_weights)


def initial_weights_fn(model: tff.learning.models.FunctionalModel) -> tff.Computation:
  """A no-arg TF computation returning the model's initial ModelWeights."""

  @tff.tensorflow.computation
  def initial_weights():
    trainable, non_trainable = model.initial_weights
    return tff.learning.models.ModelWeights(trainable, non_trainable)

  return initial_weights


def compose(algorithm: algorithm_lib.Algorithm) -> ComposedLearningProcess:
  """The LearningProcess placing `algorithm`: client work running its client rule,
  its aggregation as a `tff.aggregators` factory (`aggregation_factories.UpdateFactory`) whose
  model delta is aggregated by `algorithm.model_aggregator` (default MeanFactory; an
  `ops.privacy.PrivateMean`, an `ops.aggregators.Chain`, or TFF's robust, compression
  or DP factories) and side channels exactly, and a server update running its server
  rule.

  Raises:
    ValueError: the model aggregator is unweighted (TFF's DP factories) and the
      algorithm's aggregation is not a uniform mean (`ops.privacy.check_uniform`), or
      a chain TFF's clients cannot run (error feedback's rows; ALIE).
  """
  model_aggregator = algorithm.model_aggregator
  if isinstance(model_aggregator, tff.aggregators.UnweightedAggregationFactory):
    privacy.check_uniform(algorithm, private=True)
  weights_type = client_work_lib.model_weights_type(algorithm.model)
  server_update = server_update_lib.build_server_update(algorithm.server_rule, weights_type)
  return compose_learning_process(
    initial_model_weights_fn=initial_weights_fn(algorithm.model),
    client_work=client_work_lib.build_local_client_work(
      algorithm.client_rule,
      server_update.client_payload.type_signature.result,
      algorithm.client_options,
    ),
    aggregator=aggregation_factories.factory_for(
      algorithm.aggregation, model_aggregator, seed=algorithm.client_options.seed
    ),
    server_update=server_update,
    algorithm=algorithm,
  )


def algorithm_of(program: Any) -> Any:
  """The Algorithm of `program` (an Algorithm, or a process composed from one); any other
  program as it is."""
  if isinstance(program, ComposedLearningProcess) and program.algorithm:
    return program.algorithm
  return program
