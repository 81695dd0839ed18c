"""The interface of the in-process runtime's engines (`engines` lists them): the cohort an
engine receives, and the engine itself, which returns every client's
`ops.client_round.ClientOutput` stacked in cohort order:

    engine.run(cohort) -> ClientOutput([m] updates, [m] weights, [m] stats)
"""

from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

import numpy as np
import tensorflow as tf

from tff_comp.ops import algorithm as algorithm_lib
from tff_comp.ops import client_round
from tff_comp.runtime.inprocess import lanes as lanes_lib
from tff_comp.runtime.inprocess import resident_data


def row(structure: Any, i: Any) -> Any:
  """Row `i` of every leaf of a per-client `structure` (a cohort's plans: client i's)."""
  return tf.nest.map_structure(lambda t: t[i], structure)


class DeferredPlans(NamedTuple):
  """A cohort's plans left to the engine (`Cohort.plans`, where `plans_in_kernel`): the
  lanes kernel derives them from its padded rows, in XLA, where the 50-odd small ops of
  a cohort's plans, padding and shares cost lasso's round a measurable share as
  TensorFlow ops before its kernels (docs/speed.md). `plan(positions, client_indices,
  work)` gives the `ClientPlan`s of clients at those positions of the resident data
  (`RoundStages.client_plans`, the round bound); `offsets` and `counts` are then
  None."""

  client_indices: tf.Tensor  # [m] the clients' indices in the population
  work: tf.Tensor  # [m] the fraction of its local steps each client does
  plan: Callable[[tf.Tensor, tf.Tensor, tf.Tensor], client_round.ClientPlan]


class Cohort(NamedTuple):
  """One round's cohort as an engine receives it (per-client fields stacked to [m]).
  With `trial` (batched trials, `runtime.inprocess.trials`), `payload` and `hparams` are
  stacked per trial and client i reads row `trial[i]` of each."""

  payload: Any
  hparams: Any
  indices: tf.Tensor  # positions in ResidentData (clients' indices: plans.context)
  offsets: tf.Tensor | None  # None with DeferredPlans
  counts: tf.Tensor | None
  plans: client_round.ClientPlan | DeferredPlans
  capacity: int  # clients the lanes kernel holds (its compiled shape); 0 on other engines
  trial: tf.Tensor | None = None  # [m] int32: each client's trial (None: one run)

  def received(self, position) -> tuple[Any, Any]:
    """(payload, hparams) of the client at `position` (a scalar or [k] positions)."""
    return lanes_lib.received(self.payload, self.hparams, self.trial, position)


class Engine(Protocol):
  """Runs a cohort's client work (see the module docstring). Built as
  `Engine(algorithm, data, lanes=..., short_sizes=..., full_batches=...)`.

  `in_graph`: `run` is traced into the round's `tf.function` (else the round runs
  eagerly). `compiles_per_capacity`: `run` compiles for the cohort's `capacity` and
  the data's shape (so it needs resident data); other engines get capacity 0.
  `plans_in_kernel`: `run` takes `DeferredPlans` for rules needing no reference or
  start loss (it derives the plans itself).
  `why_not(algorithm, examples, device, payload, hparams, run_steps)`: why 'auto'
  should not choose it here ('' when it may).
  """

  name: str
  in_graph: bool
  compiles_per_capacity: bool

  @property
  def plans_in_kernel(self) -> bool:
    """`run` derives the plans of rules needing no reference or start loss."""

  def __init__(
    self,
    algorithm: algorithm_lib.Algorithm,
    data: resident_data.ResidentData,
    *,
    lanes: int,
    short_sizes: tuple[int, ...] = (),
    full_batches: np.ndarray | None = None,
    threads: int = 1,
  ) -> None: ...

  @staticmethod
  def why_not(
    algorithm, examples, device: str, payload, hparams, run_steps: int | None = None
  ) -> str:
    """Why this engine would be slow or fail here, or ''."""

  def run(self, cohort: Cohort) -> client_round.ClientOutput:
    """Every cohort client's ClientOutput, stacked in cohort order."""


class ClientByClient:
  """Base of the engines running a cohort's clients one at a time (mapped, debug): they
  take every rule TensorFlow runs, so 'auto' has no reason against them, and they ignore
  the lanes engine's construction arguments."""

  compiles_per_capacity = False
  plans_in_kernel = False

  @staticmethod
  def why_not(*args, **kwargs) -> str:
    """No reason (it runs every rule TensorFlow runs)."""
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
