"""One client's round, in pure TF: what a sampled client does with its rule.

    run_client(rule, payload, examples, hparams, context, options, round, key)
        -> ClientOutput(update, weight, stats)
     = client_context (start loss) + plan_cohort (batch plan, `local_loop.plan`)
       -> rule.initialize -> rule.step per batch -> finish_client (weight, stats,
       rule.finalize)

A runtime that schedules local steps itself (the in-process lanes) calls the phases;
TFF's client work and the mapped engine call `run_client`.

`examples` are the client's examples stacked along a leading dimension (any runtime
materializes them: TFF's client work from a dataset, the in-process runtime from
resident tensors). `run_client` fills the context's start loss when the rule uses it,
chooses the local work (epochs, epochs drawn per client and round, or a fixed number of
steps), runs the rule's steps (`ops.local_loop`), and weighs the client (the rule's own
weight, else n_i or 1). Stats are summed over clients by the runtime: loss_sum,
num_examples (examples processed), num_steps.
"""

import collections
import dataclasses
from typing import Any, NamedTuple

import tensorflow as tf

from tff_comp.ops import local_loop
from tff_comp.ops import rule as rule_lib

WEIGHTINGS = ('examples', 'uniform')
MAX_EPOCHS, MAX_STEPS = 10_000, 10_000_000


@dataclasses.dataclass(frozen=True)
class ClientOptions:
  """How much local work a client does and how it is weighed.

  batch_size: examples per local step (times the rule's batches_per_step).
  local_epochs: passes over the client's examples (the minimum when
    `local_epochs_max` is set).
  local_epochs_max: if set, epochs are drawn per client per round from
    [local_epochs, local_epochs_max] and steps are floor(E n_i / B) (FedNova's setting).
  local_steps: if set, exactly this many steps, cycling through the examples.
  seed: the run's seed of the epoch draws and of shuffling (stateless functions of
    seed, round and the client's data).
  shuffle: each epoch visits the client's examples in its own order (a stateless
    permutation of seed, round, client and epoch, the same on every runtime), as
    local SGD assumes; False: stored order (as TFF's own algorithms read a client's
    dataset). The same default as the binaries' `--shuffle`.
  weighting: 'examples' weighs a client by n_i (the same weighted mean as TFF's count
    of examples processed when all clients run the same epochs), 'uniform' by 1.
  """

  batch_size: int
  local_epochs: int = 1
  local_epochs_max: int | None = None
  local_steps: int | None = None
  seed: int = 0
  weighting: str = 'examples'
  shuffle: bool = True

  def __post_init__(self):
    # Steps are int32: epochs x examples must stay below 2^31.
    for name, most in (
      ('local_epochs', MAX_EPOCHS),
      ('local_epochs_max', MAX_EPOCHS),
      ('local_steps', MAX_STEPS),
    ):
      if (getattr(self, name) or 0) > most:
        raise ValueError(f'{name} must be <= {most}, got {getattr(self, name)}.')
    if self.batch_size < 1:
      raise ValueError(f'batch_size must be >= 1, got {self.batch_size}.')
    if self.local_epochs < 1:
      raise ValueError(f'local_epochs must be >= 1, got {self.local_epochs}.')
    if self.local_steps is not None and self.local_steps < 1:
      raise ValueError(f'local_steps must be >= 1, got {self.local_steps}.')
    if self.local_epochs_max is not None and self.local_epochs_max < self.local_epochs:
      raise ValueError(
        f'local_epochs_max ({self.local_epochs_max}) must be >= local_epochs ({self.local_epochs}).'
      )
    if self.weighting not in WEIGHTINGS:
      raise ValueError(
        f'client_weighting={self.weighting!r} is unknown; choose one of {list(WEIGHTINGS)}.'
      )

  @property
  def single_pass(self) -> bool:
    """Whether every client makes exactly one pass over its examples (no full batch
    wraps around them, so batches are slices)."""
    return self.local_steps is None and self.local_epochs_max is None and self.local_epochs == 1

  @property
  def uses_client_key(self) -> bool:
    """Whether schedules read the clients' `local_loop.client_key` (epoch draws,
    shuffling)."""
    return self.local_epochs_max is not None or self.shuffle


class ClientWorkState(NamedTuple):
  """The client work's state on every runtime: the client rule's hyperparameters
  (float32 scalars, get/set between rounds) and the number of rounds run."""

  hparams: collections.OrderedDict
  round: tf.Tensor


class ClientOutput(NamedTuple):
  update: Any
  weight: tf.Tensor
  stats: collections.OrderedDict


class ClientPlan(NamedTuple):
  """A client's round before its local steps (fields stacked to [m] for a cohort):
  the context (start loss filled in) and the batch plan."""

  context: rule_lib.RoundContext
  batches: local_loop.BatchPlan


def step_batch_size(rule: rule_lib.ClientRule, options: ClientOptions) -> int:
  """Examples a local step receives (the rule's batches concatenated)."""
  return options.batch_size * rule.batches_per_step


def plan_cohort(
  rule: rule_lib.ClientRule, options: ClientOptions, counts, keys, round_num, seed=None
) -> local_loop.BatchPlan:
  """The batch plan of clients with `counts` examples and `keys`
  (`local_loop.client_key`) in round `round_num`, one client or a cohort ([m]);
  `seed` (per client, for batched trials) in place of `options.seed`."""
  return local_loop.plan(
    counts,
    keys,
    round_num,
    batch_size=step_batch_size(rule, options),
    epochs=options.local_epochs,
    epochs_max=options.local_epochs_max,
    steps=options.local_steps,
    seed=options.seed if seed is None else seed,
    shuffle=options.shuffle,
  )


def client_context(
  rule: rule_lib.ClientRule, payload, examples, hparams, context: rule_lib.RoundContext
) -> rule_lib.RoundContext:
  """`context` with the client's start loss when the rule uses it."""
  if rule.uses_start_loss:
    return context._replace(start_loss=rule.start_loss(payload, examples, hparams))
  return context


def finish_client(
  rule: rule_lib.ClientRule,
  state: rule_lib.LocalState,
  steps,
  payload,
  hparams,
  context: rule_lib.RoundContext,
  options: ClientOptions,
  num_examples: tf.Tensor,
) -> ClientOutput:
  """The update, weight and stats of a client whose local steps ended in `state`."""
  weight = rule.client_weight(payload, hparams, context)
  if weight is None and options.weighting == 'examples':
    weight = tf.cast(num_examples, tf.float32)
  elif weight is None:
    weight = tf.constant(1.0)
  stats = collections.OrderedDict(
    loss_sum=state.loss_sum,
    num_examples=tf.cast(state.examples, tf.float32),
    num_steps=tf.cast(steps, tf.float32),
  )
  return ClientOutput(rule.finalize(state, payload, hparams, context), weight, stats)


def run_planned(
  rule: rule_lib.ClientRule, payload, examples, hparams, plan: ClientPlan, options: ClientOptions
) -> ClientOutput:
  """A client's round from its plan: the rule's local steps on `examples`."""
  state = local_loop.run_scheduled_steps(
    lambda s, batch: rule.step(s, batch, payload, hparams, plan.context),
    rule.initialize(payload, hparams, plan.context),
    examples,
    plan.batches,
    batch_size=step_batch_size(rule, options),
    contiguous=options.single_pass,
    shuffle=options.shuffle,
  )
  return _finish_planned(rule, state, payload, examples, hparams, plan, options)


def planned_output_like(
  rule: rule_lib.ClientRule, payload, examples, hparams, plan: ClientPlan, options: ClientOptions
) -> ClientOutput:
  """`run_planned`'s output in structure, dtypes and shapes, without its local steps (a
  loop keeps its state's shapes): the spec of a map over clients at a small part of the
  cost of tracing their steps."""
  start = rule.initialize(payload, hparams, plan.context)
  return _finish_planned(rule, start, payload, examples, hparams, plan, options)


def _finish_planned(
  rule: rule_lib.ClientRule, state, payload, examples, hparams, plan: ClientPlan, options
) -> ClientOutput:
  """`finish_client` for a client of `plan` whose local steps ended in `state`."""
  return finish_client(
    rule,
    state,
    plan.batches.steps,
    payload,
    hparams,
    plan.context,
    options,
    local_loop.num_examples(examples),
  )


def run_client(
  rule: rule_lib.ClientRule,
  payload,
  examples,
  hparams,
  context: rule_lib.RoundContext,
  options: ClientOptions,
  round_num: tf.Tensor,
) -> ClientOutput:
  """One client's round: the rule's local steps on `examples` from `payload`."""
  key = local_loop.client_key(examples) if options.uses_client_key else tf.constant(0, tf.int64)
  batches = plan_cohort(rule, options, local_loop.num_examples(examples), key, round_num)
  plan = ClientPlan(client_context(rule, payload, examples, hparams, context), batches)
  return run_planned(rule, payload, examples, hparams, plan, options)


def train_metrics(stats_sum, reference_loss: tf.Tensor | None) -> collections.OrderedDict:
  """Round measurements from the clients' summed stats: the example-weighted mean
  training loss at the visited iterates, examples and steps (and the reference loss)."""
  metrics = collections.OrderedDict(
    train_loss=tf.math.divide_no_nan(stats_sum['loss_sum'], stats_sum['num_examples']),
    num_examples=stats_sum['num_examples'],
    num_steps=stats_sum['num_steps'],
  )
  if reference_loss is not None:
    metrics['reference_loss'] = reference_loss
  return metrics
