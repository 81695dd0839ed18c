"""Buffered asynchronous aggregation's events in simulated time (FedBuff; the schedule
of `run.buffered_async`'s docstring): which clients are dispatched while each model is
in force, which arrivals each server step aggregates (with their staleness), which are
dropped as too stale, and the clock at each step. It depends on the sampler's draws and
the devices' times only, not on the model, so a resumed or replayed run sees the same
plans.
"""

from collections.abc import Callable, Sequence
import heapq
from typing import NamedTuple


class Arrival(NamedTuple):
  """A client's report: its dispatch number, id, the version it started from."""

  seq: int
  client: str
  version: int


class StepPlan(NamedTuple):
  """Server step t's events: the clients dispatched while x_{t-1} was in force (their
  dispatch numbers and ids), the arrivals it aggregates (and the staleness of each),
  the arrivals since the step before dropped as too stale, and the simulated clock at
  the step."""

  cohort: tuple[tuple[int, str], ...]
  arrivals: tuple[Arrival, ...]
  staleness: tuple[int, ...]
  dropped: tuple[Arrival, ...]
  clock: float


class Schedule:
  """The event simulation of the module docstring, independent of the model: `plan(t)`
  for t = 1, 2, ..., computed in order and cached (a resumed or replayed run sees the
  same plans).

  Args:
    draw: r -> the clients of the sampler's round r (dispatched in that order).
    seconds: a client's device time.
    concurrency: clients training at once (`--concurrency`).
    buffer_size: arrivals a server step aggregates (`--buffer_size`).
    max_staleness: arrivals staler are dropped (`--max_staleness`; None: none).
  """

  def __init__(
    self,
    draw: Callable[[int], Sequence[str]],
    seconds: Callable[[str], float],
    *,
    concurrency: int,
    buffer_size: int,
    max_staleness: int | None,
  ):
    self._draw, self._seconds = draw, seconds
    self._buffer_size, self._max_staleness = buffer_size, max_staleness
    self._stream: list[str] = []  # clients drawn, not yet dispatched
    self._blocks = 0
    self._flight: list[tuple[float, int, str, int]] = []  # (arrival, seq, client, version)
    self._seq, self._version, self._clock = 0, 0, 0.0
    self._dispatched: list[tuple[int, str]] = []  # while the current version is in force
    self._plans: list[StepPlan] = []
    self._buffer: list[tuple[Arrival, int]] = []
    self._dropped: list[Arrival] = []
    for _ in range(concurrency):
      self._dispatch()

  def _dispatch(self) -> None:
    while not self._stream:
      self._blocks += 1
      self._stream = list(self._draw(self._blocks))
    client = self._stream.pop(0)
    heapq.heappush(
      self._flight, (self._clock + self._seconds(client), self._seq, client, self._version)
    )
    self._dispatched.append((self._seq, client))
    self._seq += 1

  def plan(self, step: int) -> StepPlan:
    while len(self._plans) < step:
      self._advance()
    return self._plans[step - 1]

  def _advance(self) -> None:
    """Runs events until the next server step is planned."""
    planned = len(self._plans)
    while len(self._plans) == planned:
      self._clock = self._flight[0][0]
      arrived = []
      while self._flight and self._flight[0][0] == self._clock:
        _, seq, client, version = heapq.heappop(self._flight)
        arrived.append(Arrival(seq, client, version))
      for arrival in arrived:
        staleness = self._version - arrival.version
        if self._max_staleness is not None and staleness > self._max_staleness:
          self._dropped.append(arrival)
        else:
          self._buffer.append((arrival, staleness))
        if len(self._buffer) == self._buffer_size:
          self._plans.append(
            StepPlan(
              tuple(self._dispatched),
              tuple(a for a, _ in self._buffer),
              tuple(s for _, s in self._buffer),
              tuple(self._dropped),
              self._clock,
            )
          )
          self._buffer, self._dropped, self._dispatched = [], [], []
          self._version += 1
      for _ in arrived:
        self._dispatch()
