"""An algorithm's math, whole: the unit every runtime runs.

`Algorithm(model, client_rule, server_rule, client_options, aggregation)` is runtime
free: registered algorithm builders (`tff_comp.algorithms`) return one, and each runtime
(`tff_comp.runtime`: TFF's process, the in-process engines) runs the same rules, so they
give the same results. A round, for the cohort S:

    P   = server_rule.payload(S_server, W)                           broadcast
    U_i = client_round.run_client(client_rule, P, data_i, ...)       for i in S
    U   = aggregation(U_i, weights_i)                                ops.aggregation
    (S_server, W) = server_rule.step(S_server, W, U)

Built, it checks its contract (`ops.contract`: the payload against the client rule's
start, the update against the aggregation kind and the server rule), so a mismatch is
one line at construction on every runtime, not an error deep inside a round.
`tff_comp.learning_process.composer.compose(algorithm)` places it in a genuine TFF LearningProcess.
"""

import dataclasses
from typing import Any

from tff_comp.ops import aggregation as aggregation_lib
from tff_comp.ops import client_round, contract, privacy
from tff_comp.ops import rule as rule_lib


@dataclasses.dataclass(frozen=True)
class Algorithm:
  """model: a FunctionalModel; aggregation: one of `ops.aggregation.KINDS`.

  model_aggregator: what averages the model delta in place of the weighted mean (side
  channels stay exact): None; an `ops.privacy.PrivateMean` (clipping, DP; every
  runtime runs it); or any `tff.aggregators` factory (TFF's robust, compression or DP
  factories), which only TFF's runtime runs.
  """

  model: Any
  client_rule: rule_lib.ClientRule
  server_rule: rule_lib.ServerRule
  client_options: client_round.ClientOptions
  aggregation: str = aggregation_lib.MEAN
  model_aggregator: Any = None

  def with_client_options(self, **changes) -> 'Algorithm':
    """This algorithm with `client_options` fields replaced (a run's seed, shuffling)."""
    return dataclasses.replace(
      self, client_options=dataclasses.replace(self.client_options, **changes)
    )

  def __post_init__(self):
    """Raises ValueError (`contract.ContractError` for blocks that do not fit)."""
    if self.aggregation not in aggregation_lib.KINDS:
      raise ValueError(
        f'aggregation={self.aggregation!r} is unknown; choose one of {aggregation_lib.KINDS}.'
      )
    if isinstance(self.model_aggregator, privacy.PrivateMean) and self.model_aggregator.private:
      privacy.check_uniform(self)
    contract.check(self)
