"""An algorithm's math, whole: the unit every runtime runs.

`Algorithm(model, client_rule, server_rule, client_options, aggregation)` is runtime
free: registered algorithm builders (`tff_comp.algorithms`) return one, and each runtime
(`tff_comp.runtime`: TFF's process, the in-process engines) runs the same rules, so they
give the same results. A round, for the cohort S:

    P   = server_rule.payload(S_server, W)                           broadcast
    U_i = client_round.run_client(client_rule, P, data_i, ...)       for i in S
    U   = aggregation(U_i, weights_i)                                ops.update_aggregation
    (S_server, W) = server_rule.step(S_server, W, U)

Built, it checks its contract (`ops.contract`: the payload against the client rule's
start, the update against the aggregation kind and the server rule), so a mismatch is
one line at construction on every runtime, not an error deep inside a round.
`tff_comp.learning_process.composer.compose(algorithm)` places it in a genuine TFF LearningProcess.
"""

import copy
import dataclasses
import functools
from typing import Any

import tensorflow as tf

from tff_comp.ops import aggregators, client_round, contract, privacy
from tff_comp.ops import rule as rule_lib
from tff_comp.ops import update_aggregation as aggregation_lib


@dataclasses.dataclass(frozen=True)
class Algorithm:
  """model: a FunctionalModel; aggregation: how the update's fields combine
  (`ops.update_aggregation`: MEAN, NORMALIZED, SLOTS, or another `UpdateAggregation`).

  model_aggregator: what aggregates the model delta in place of the weighted mean
  (side channels stay exact): None; a chain of the aggregator blocks
  (`ops.aggregators.Chain`: robust, Byzantine-robust, compressed, secure) or an
  `ops.privacy.PrivateMean` (clipping, DP: a chain too), which the in-process runtimes
  run; or any `tff.aggregators` factory (TFF's robust, compression or DP factories),
  which only TFF's runtime runs.
  """

  model: Any
  client_rule: rule_lib.ClientRule
  server_rule: rule_lib.ServerRule
  client_options: client_round.ClientOptions
  aggregation: aggregation_lib.UpdateAggregation = aggregation_lib.MEAN
  model_aggregator: Any = None

  def with_client_options(self, **changes) -> 'Algorithm':
    """This algorithm with `client_options` fields replaced (a run's seed, shuffling)."""
    options = dataclasses.replace(self.client_options, **changes)
    if options.weighting != self.client_options.weighting:
      return dataclasses.replace(self, client_options=options)  # checked again
    # The checks of `__post_init__` read only the weighting of the client options (the
    # contract traces no local step), so they hold for this copy: a builder's seed and
    # shuffling, set on every build, would trace the contract again for nothing.
    changed = copy.copy(self)
    object.__setattr__(changed, 'client_options', options)
    return changed

  def __post_init__(self):
    """Raises ValueError (`contract.ContractError` for blocks that do not fit)."""
    if not isinstance(self.aggregation, aggregation_lib.UpdateAggregation):
      raise ValueError(
        f'aggregation={self.aggregation!r} is not an ops.update_aggregation.UpdateAggregation'
        ' (MEAN, NORMALIZED, SLOTS).'
      )
    chain = self.model_chain
    if chain is not None and not chain.weighted:
      private = isinstance(self.model_aggregator, privacy.PrivateMean)
      privacy.check_uniform(self, private=private and self.model_aggregator.private)
    contract.check(self)

  @functools.cached_property
  def model_chain(self) -> aggregators.Chain | None:
    """The chain aggregating the model part of the updates (the delta; FedNova's
    normalized delta), bound to its size; None: the weighted mean, or a TFF factory."""
    given = self.model_aggregator
    if isinstance(given, privacy.PrivateMean):
      given = given.chain()
    if not isinstance(given, aggregators.Chain):
      return None
    spec = self.server_rule.update_spec()
    part = spec.delta if hasattr(spec, 'delta') else spec
    return given.bind(sum(leaf.shape.num_elements() for leaf in tf.nest.flatten(part)))
