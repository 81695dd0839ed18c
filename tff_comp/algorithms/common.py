"""Helpers for algorithm modules: argument checks, server optimizers, the Algorithm
shapes most algorithms share, and `process_builder`, which turns an Algorithm builder
into the `build_<algo>` that returns a genuine TFF LearningProcess."""

from collections.abc import Callable
import functools
import inspect

import tensorflow_federated as tff

from tff_comp.learning_process import aggregation_factories, composer
from tff_comp.ops import algorithm as algorithm_lib
from tff_comp.ops import client_round, model_ops, sgd, update_aggregation
from tff_comp.ops import rule as rule_lib


def check_positive(**values: float) -> None:
  """Raises ValueError naming the first argument that is not > 0."""
  for name, value in values.items():
    if not value > 0:
      raise ValueError(f'{name} must be > 0, got {value}.')


def check_nonnegative(**values: float) -> None:
  """Raises ValueError naming the first argument that is not >= 0."""
  for name, value in values.items():
    if not value >= 0:
      raise ValueError(f'{name} must be >= 0, got {value}.')


def server_sgd(learning_rate: float, momentum: float = 0.0) -> tff.learning.optimizers.Optimizer:
  """SGD (with heavy-ball momentum when momentum > 0) at the server."""
  check_positive(server_learning_rate=learning_rate)
  check_nonnegative(server_momentum=momentum)
  return tff.learning.optimizers.build_sgdm(learning_rate=learning_rate, momentum=momentum or None)


def algorithm(
  model,
  client_rule: rule_lib.ClientRule,
  server_rule: rule_lib.ServerRule,
  options: client_round.ClientOptions,
  *,
  aggregation_kind: update_aggregation.UpdateAggregation = update_aggregation.MEAN,
  model_aggregator: aggregation_factories.ModelAggregator | None = None,
) -> algorithm_lib.Algorithm:
  """Algorithm(model, client_rule, server_rule, options, aggregation, model_aggregator)."""
  return algorithm_lib.Algorithm(
    model, client_rule, server_rule, options, aggregation_kind, model_aggregator
  )


def composite(
  model,
  client_rule_class,
  server_rule_class,
  regularizer,
  *,
  client_learning_rate: float,
  server_learning_rate: float,
  batch_size: int,
  local_epochs: int,
  client_weighting: str,
  client_prox: bool,
  model_aggregator: aggregation_factories.ModelAggregator | None = None,
) -> algorithm_lib.Algorithm:
  """A composite-optimization algorithm (`ops.composite`): a client rule of
  `client_rule_class` with psi, and a server rule of `server_rule_class` with SGD(eta_s)
  and psi, weights averaged by the plain weighted mean."""
  check_positive(client_learning_rate=client_learning_rate)
  rule = client_rule_class(
    model, learning_rate=client_learning_rate, regularizer=regularizer, client_prox=client_prox
  )
  server_rule = server_rule_class(
    model_ops.trainable_specs(model), server_sgd(server_learning_rate), regularizer
  )
  return algorithm(
    model,
    rule,
    server_rule,
    client_round.ClientOptions(batch_size, local_epochs, weighting=client_weighting),
    model_aggregator=model_aggregator,
  )


def local_sgd_options(
  batch_size: int,
  local_epochs: int,
  *,
  local_epochs_max: int = 0,
  local_steps: int = 0,
  seed: int = 0,
  weighting: str = 'examples',
) -> client_round.ClientOptions:
  """Local SGD's client options: `local_epochs` passes, or epochs drawn up to
  `local_epochs_max` (> 0), or exactly `local_steps` (> 0) steps of `batch_size`
  cycling through the examples. Raises ValueError (one line) for both of the last two."""
  if local_steps and local_epochs_max:
    raise ValueError(
      "local_steps fixes every client's steps and local_epochs_max draws them: give one."
    )
  return client_round.ClientOptions(
    batch_size,
    local_epochs,
    local_epochs_max or None,
    local_steps or None,
    seed=seed,
    weighting=weighting,
  )


def fedavg_like(
  model,
  client_rule: rule_lib.ClientRule,
  options: client_round.ClientOptions,
  *,
  server_learning_rate: float = 1.0,
  server_momentum: float = 0.0,
  server_optimizer: tff.learning.optimizers.Optimizer | None = None,
  aggregation_kind: update_aggregation.UpdateAggregation = update_aggregation.MEAN,
  model_aggregator: aggregation_factories.ModelAggregator | None = None,
) -> algorithm_lib.Algorithm:
  """FedAvg's skeleton around any client rule: a server optimizer (default SGD(eta_s,
  momentum)) on the aggregated update."""
  server_rule = sgd.OptimizerServer(
    model_ops.trainable_specs(model),
    server_optimizer or server_sgd(server_learning_rate, server_momentum),
  )
  return algorithm(
    model,
    client_rule,
    server_rule,
    options,
    aggregation_kind=aggregation_kind,
    model_aggregator=model_aggregator,
  )


def process_builder(
  algorithm_fn: Callable[..., algorithm_lib.Algorithm],
) -> Callable[..., composer.ComposedLearningProcess]:
  """`build_<algo>`: `algorithm_fn`'s arguments in, its Algorithm composed into a
  genuine `tff.learning.templates.LearningProcess` out (`composer.compose`), for
  researchers who compose with TFF. Two more keywords set the clients' local data
  order: `shuffle` (default True, as `run.py`: each epoch in its own stateless order)
  and `seed` (of that order and of drawn epochs; the algorithm's own `seed` where it
  has one). `shuffle=False` reads each client's data in its stored order, as TFF's own
  algorithms do: `build_fedavg(..., shuffle=False)` equals TFF's
  `build_weighted_fed_avg` on the same inputs (tests/test_parity.py)."""
  takes_seed = 'seed' in inspect.signature(algorithm_fn).parameters

  @functools.wraps(algorithm_fn)
  def build(
    *args, shuffle: bool = True, seed: int = 0, **kwargs
  ) -> composer.ComposedLearningProcess:
    if takes_seed:
      kwargs['seed'] = seed
    return composer.compose(
      algorithm_fn(*args, **kwargs).with_client_options(shuffle=shuffle, seed=seed)
    )

  build.__name__ = build.__qualname__ = f'build_{algorithm_fn.__name__}'
  build.__doc__ = (
    f'The TFF LearningProcess of `{algorithm_fn.__name__}` (same'
    f" arguments, and `shuffle` and `seed` of the clients' local data"
    f' order: `common.process_builder`).\n\n{algorithm_fn.__doc__ or ""}'
  )
  return build
