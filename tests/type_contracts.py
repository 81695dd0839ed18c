"""Contracts the type checker holds (`make typecheck` checks this file, not pytest):
each line marked `type: ignore[code]` must be that error, or mypy reports the ignore as
unused (`warn_unused_ignores` for this module in pyproject.toml), so an annotation
loosened to Any fails the build. Never run."""

from typing import Any

from tff_comp.algorithms import fedavg
from tff_comp.learning_process import aggregation_factories
from tff_comp.ops import aggregators as agg
from tff_comp.ops import privacy


def _contracts(model: Any) -> None:
  chain = agg.Chain((agg.Clip(1.0),), agg.Median())
  # A builder's model_aggregator takes a chain, a mechanism or a TFF factory ...
  fedavg.fedavg(model, client_learning_rate=0.1, model_aggregator=chain)
  fedavg.fedavg(model, client_learning_rate=0.1, model_aggregator=privacy.ClippedMean(1.0))
  # ... and nothing else: not a registered name.
  fedavg.fedavg(model, client_learning_rate=0.1, model_aggregator='median')  # type: ignore[arg-type]
  # A chain is not a TFF factory where one is needed.
  factory: aggregation_factories.Factory = chain  # type: ignore[assignment]
  # Stages and combiners keep their places in a chain.
  agg.Chain((agg.Median(),), agg.Median())  # type: ignore[arg-type]
  agg.Chain((), agg.Clip(1.0))  # type: ignore[arg-type]
  del factory
