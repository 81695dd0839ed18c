"""The in-process runtime's debug engine (`--engine=debug`; the interface is
`engine_interface`'s): a cohort's clients one by one, step by step, eagerly in Python, so
that a failure names the client and the stage (initialize, local step k, finalize). Slow;
for finding bugs."""

import tensorflow as tf

from tff_comp.ops import client_round, local_loop
from tff_comp.runtime import error_text
from tff_comp.runtime.inprocess import engine_interface


class ClientError(RuntimeError):
  """A client's work failed (debug engine); the message names the client and stage."""


class DebugEngine(engine_interface.ClientByClient):
  """Clients one by one, step by step, eagerly; a failure raises ClientError naming
  the client id, the stage and the error."""

  name = 'debug'
  in_graph = False

  def run(self, cohort: engine_interface.Cohort) -> client_round.ClientOutput:
    rule, options = self._algorithm.client_rule, self._algorithm.client_options
    size = client_round.step_batch_size(rule, options)
    outputs = []
    for position, index in enumerate(cohort.indices.numpy()):
      plan = engine_interface.row(cohort.plans, position)
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
