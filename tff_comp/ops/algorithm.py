"""An algorithm's math, whole: the record every runtime runs.

`Algorithm(model, client_rule, server_rule, client_options, aggregation)` is all a
runtime needs: TFF's (`tff_comp.composer.compose` places it in a LearningProcess) and
the in-process one (`tff_comp.runtime.inprocess`) run the same rules, so both give the
same results. Algorithm builders (`tff_comp.algorithms`) make one and compose it.
"""

import dataclasses
from typing import Any

from tff_comp.ops import aggregation as aggregation_lib
from tff_comp.ops import protocol
from tff_comp.ops import rule as rule_lib


@dataclasses.dataclass(frozen=True)
class Algorithm:
  """model: a FunctionalModel; aggregation: one of `ops.aggregation.KINDS`."""

  model: Any
  client_rule: rule_lib.ClientRule
  server_rule: rule_lib.ServerRule
  client_options: protocol.ClientOptions
  aggregation: str = aggregation_lib.MEAN

  def __post_init__(self):
    if self.aggregation not in aggregation_lib.KINDS:
      raise ValueError(f'aggregation={self.aggregation!r} is unknown; choose one of'
                       f' {aggregation_lib.KINDS}.')
