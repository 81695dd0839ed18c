"""Threads that meet: members 0..size-1, each on a thread of its own, hand over an item
(`meet`) and wait; once every member still in (not `leave`d) waits, the last to arrive
runs the items together (`_run`, a subclass's: a group of trials' batched round,
`trials.TrialGroup`) and each member gets its result. A member may instead ask for its
share of a function run once on every asker's item (`together`: a grid's evaluations).
Between meetings the members' threads take turns, one at a time.

Python's threading primitives (a Condition, a Lock) are enough; a barrier
(`threading.Barrier`) would not do, since members leave at different times and the
runner is whichever arrives last.
"""

from collections.abc import Callable
import threading
from typing import Any, Generic, TypeVar

Item = TypeVar('Item')


class Rendezvous(Generic[Item]):
  """`size` members meeting (see the module docstring); `_run(batch)` maps {member: its
  item} to {member: its result, or the error to raise in its thread}."""

  def __init__(self, size: int):
    self.size = size
    self._lock = threading.Condition()
    self._active = set(range(size))
    self._waiting: dict[int, Item] = {}
    self._asking: dict[int, tuple[Any, Callable[[list[Any]], list[Any]]]] = {}  # `together`
    self._results: dict[int, Any] = {}
    self._turn = threading.Lock()  # held by the member whose thread runs (`_in_turn`)
    self._turn_of: int | None = None

  def _run(self, batch: dict[int, Item]) -> dict[int, Any]:
    raise NotImplementedError

  def meet(self, t: int, item: Item) -> Any:
    """Member `t`'s result of `_run` on its `item`; returns once the batch has run."""
    self._end_turn(t)
    with self._lock:
      self._waiting[t] = item
      result = self._result(t)
    return self._in_turn(t, result)

  def together(self, t: int, item: Any, run: Callable[[list[Any]], list[Any]]) -> Any:
    """Member `t`'s share of `run(items)`, run once on the items of every member asking
    when each member still in waits here or in `meet`. `run` gives a result per item, or
    the error to raise in that item's member; the first asker's `run` runs them."""
    self._end_turn(t)
    with self._lock:
      self._asking[t] = (item, run)
      result = self._result(t)
    return self._in_turn(t, result)

  def leave(self, t: int) -> None:
    """Member `t` ended: the others no longer wait for it."""
    self._end_turn(t)
    with self._lock:
      self._active.discard(t)
      self._run_if_all_waiting()

  def _result(self, t: int) -> Any:
    """Member `t`'s result once what it waits for has run. Called holding the lock."""
    self._run_if_all_waiting()
    self._lock.wait_for(lambda: t in self._results)
    return self._results.pop(t)

  def _in_turn(self, t: int, result: Any) -> Any:
    """`result` (raised if an error) once member `t` has the turn: between meetings the
    members' threads run one at a time. Woken together, Python threads spend their time
    handing the GIL to one another: in fco_lasso's fedmid group (36 trials) a sampler's
    draw took three times the CPU it takes in turns, and the group's round was slower."""
    if isinstance(result, BaseException):
      raise result  # without the turn: the member ends, or runs on without taking turns
    self._turn.acquire()
    self._turn_of = t
    return result

  def _end_turn(self, t: int) -> None:
    """Member `t` gives up the turn if it has it (it waits, or it ended)."""
    if self._turn_of == t:
      self._turn_of = None
      self._turn.release()

  def _run_if_all_waiting(self) -> None:
    """Once every member still in waits: what members asked `together`, else `_run`."""
    if set(self._waiting) | set(self._asking) != self._active or not self._active:
      return
    if self._asking:
      asked, self._asking = self._asking, {}
      run = next(iter(asked.values()))[1]
      try:
        results = run([item for item, _ in asked.values()])
      except BaseException as error:  # each member raises it
        results = [error] * len(asked)
      self._results.update(zip(asked, results))
      self._lock.notify_all()
      return
    batch, self._waiting = self._waiting, {}
    try:
      outputs = self._run(batch)
    except BaseException as error:  # each member raises it
      outputs = {t: error for t in batch}
    self._results.update(outputs)
    self._lock.notify_all()
