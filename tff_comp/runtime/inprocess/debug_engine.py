"""The in-process runtime's debug engine (`--engine=debug`; `engines` has the interface):
a cohort's clients one by one, step by step, eagerly in Python, so that a failure names
the client and the stage (initialize, local step k, finalize). Slow; for finding bugs."""

from typing import TYPE_CHECKING

import numpy as np
import tensorflow as tf

from tff_comp.ops import algorithm as algorithm_lib
from tff_comp.ops import client_round, local_loop
from tff_comp.runtime import error_text
from tff_comp.runtime.inprocess import resident_data

if TYPE_CHECKING:  # engines imports this module for its table of engines
  from tff_comp.runtime.inprocess.engines import Cohort


class ClientError(RuntimeError):
  """A client's work failed (debug engine); the message names the client and stage."""


class DebugEngine:
  """Clients one by one, step by step, eagerly; a failure raises ClientError naming
  the client id, the stage and the error."""

  name = 'debug'
  in_graph = False
  compiles_per_capacity = False
  plans_in_kernel = False

  @staticmethod
  def why_not(*args, **kwargs) -> str:
    """No reason ('auto' never tries it: it is for finding bugs)."""
    del args, kwargs
    return ''

  def __init__(
    self,
    algorithm: algorithm_lib.Algorithm,
    data: resident_data.ResidentData,
    *,
    lanes: int = 0,
    short_sizes: tuple[int, ...] = (),
    full_batches: np.ndarray | None = None,
    threads: int = 1,
  ):
    del lanes, short_sizes, full_batches, threads  # the lanes engine's
    self._algorithm, self._data = algorithm, data

  def run(self, cohort: 'Cohort') -> client_round.ClientOutput:
    rule, options = self._algorithm.client_rule, self._algorithm.client_options
    size = client_round.step_batch_size(rule, options)
    outputs = []
    for position, index in enumerate(cohort.indices.numpy()):
      plan = tf.nest.map_structure(lambda t, p=position: t[p], cohort.plans)
      client = int(plan.context.client_index)  # in the population
      examples = self._data.client_examples(int(index))
      n = local_loop.num_examples(examples)
      stage = 'initialize'
      payload, hparams = cohort.received(position)
      try:
        state = rule.initialize(payload, hparams, plan.context)
        for k in range(int(plan.batches.steps)):
          stage = f'local step {k}'
          batch = tf.nest.map_structure(
            lambda t, k=k: tf.gather(
              t,
              local_loop.batch_index(k, plan.batches, size, n, options.shuffle),  # noqa: B023 (called in this iteration)
            ),
            examples,
          )
          state = rule.step(state, batch, payload, hparams, plan.context)
        stage = 'finalize'
        outputs.append(
          client_round.finish_client(
            rule, state, plan.batches.steps, payload, hparams, plan.context, options, n
          )
        )
      except Exception as error:  # re-raised, named
        raise ClientError(
          f'client {self._data.client_ids[client]!r} (index {client}) failed in'
          f' {stage} of {type(rule).__name__}: {type(error).__name__}:'
          f' {error_text.last_line(error)}'
        ) from error
    return tf.nest.map_structure(lambda *rows: tf.stack(rows), *outputs)
