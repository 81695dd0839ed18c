"""TFF's own scale-out: a round's clients split across several C++ workers.

    addresses = workers.parse_addresses('10.0.0.2:8000,10.0.0.3:8000')
    workers.install_remote_runtime(addresses)   # TFF's default context from now on
    workers.check_mergeable(process)            # one aggregation stage per round?

Start one worker per host with `python -m tff_comp.binaries.worker --port=8000` (TFF's
bundled `worker_binary`). TFF's `MergeableCompExecutionContext` compiles a round into
its part up to the aggregation, a merge and the part after it; each worker runs the
first part on its share of the round's clients, the partial aggregates are merged and
the round finishes (results equal one worker's: `tests/test_workers.py`). Only rounds
with one aggregation stage compile to that form; `check_mergeable` turns TFF's compiler
error for the others (DRFL's round reference loss, a maximum over clients before the
mean) into one line.

What TFF leaves to the caller, done here:
* a worker that dies makes TFF retry forever (UNAVAILABLE, backing off to 30 s): every
  call is watched, and a worker whose connection stays down for `deadline_seconds`
  fails the call with one line naming it (`WorkerError`);
* `worker_binary` listens on all interfaces with no authentication and has no flag to
  bind an address: keep workers on a private network or behind a firewall.
  `start_local_workers` (tests, benchmarks) starts them on this machine, bound to die
  with Python, and talks to them over loopback;
* client data are read where the clients run: the data cache (`$TFF_COMP_DATA_DIR`)
  must hold the same files at the same path on every worker host.
"""

from collections.abc import Sequence
import dataclasses
import subprocess
import threading
import time
from typing import Any

import portpicker
import tensorflow_federated as tff

from tff_comp import settings
from tff_comp.runtime import local_worker

_POLL_SECONDS = 0.2


class WorkerError(RuntimeError):
  """A remote worker did not answer; the message names it."""


class NotMergeableError(ValueError):
  """A process whose rounds TFF cannot split across workers; the message says why."""


def parse_addresses(spec: str) -> list[str]:
  """'host:port,host:port' as a list; ValueError naming a malformed entry."""
  addresses = [part.strip() for part in spec.split(',') if part.strip()]
  if not addresses:
    raise ValueError('--workers needs host:port addresses, e.g. 10.0.0.2:8000,10.0.0.3:8000.')
  for address in addresses:
    host, colon, port = address.rpartition(':')
    if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
      raise ValueError(f'worker address {address!r} is not host:port (e.g. 10.0.0.2:8000).')
  if len(set(addresses)) < len(addresses):
    raise ValueError(f'worker addresses repeat: {spec!r}.')
  return addresses


def _addresses(spec: str) -> tuple[str, ...]:
  return tuple(parse_addresses(spec))


@dataclasses.dataclass(frozen=True)
class WorkerOptions:
  """TFF's runtime split across remote workers."""

  workers: tuple[str, ...] = settings.setting(
    help="host:port,... of TFF workers to split each round's clients across (TFF's"
    ' runtime; start one per host with `python -m tff_comp.binaries.worker --port=PORT`;'
    ' private network only).',
    default_factory=tuple,
    parse=_addresses,
    resumable=True,
  )


class _WatchedContext(tff.framework.MergeableCompExecutionContext):
  """TFF's mergeable context; a call fails once a worker has been unreachable for
  `deadline` seconds (TFF itself would retry forever)."""

  def __init__(self, stubs: dict[str, Any], deadline: float):
    super().__init__(
      [
        local_worker.execution_context(lambda stub=stub: stub, tff.framework.AsyncExecutionContext)
        for stub in stubs.values()
      ],
      compiler_fn=tff.backends.native.compile_to_mergeable_comp_form,
      transform_args=tff.tensorflow.transform_args,
      transform_result=tff.tensorflow.transform_result,
    )
    self._stubs = stubs
    self._deadline = deadline

  def invoke(self, comp, arg=None):
    outcome = {}

    def call():
      try:
        outcome['value'] = super(_WatchedContext, self).invoke(comp, arg)
      except BaseException as error:
        outcome['error'] = error

    # A daemon thread: a call stuck on a dead worker never holds the interpreter.
    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    down_since = {}
    while thread.is_alive():
      thread.join(_POLL_SECONDS)
      now = time.monotonic()
      for address, stub in self._stubs.items():
        if stub.is_ready:
          down_since.pop(address, None)
        else:
          down_since.setdefault(address, now)
      dead = sorted(a for a, t in down_since.items() if now - t >= self._deadline)
      if thread.is_alive() and dead:
        raise WorkerError(
          f'TFF worker(s) {", ".join(dead)} unreachable for'
          f' {self._deadline:g} s; restart them on the same address(es)'
          ' or run without them.'
        )
    if 'error' in outcome:
      raise outcome['error']
    return outcome['value']


def install_remote_runtime(addresses: Sequence[str], *, deadline_seconds: float = 60.0) -> None:
  """Makes TFF's default context split each round's clients across `addresses`.

  Raises:
    WorkerError: a worker did not answer within `deadline_seconds`.
  """
  stubs = {address: local_worker.grpc_stub(address) for address in addresses}
  wait_until = time.monotonic() + deadline_seconds
  while not all(stub.is_ready for stub in stubs.values()):
    if time.monotonic() > wait_until:
      down = sorted(a for a, s in stubs.items() if not s.is_ready)
      raise WorkerError(
        f'TFF worker(s) {", ".join(down)} did not answer within'
        f' {deadline_seconds:g} s; start one on each host with'
        ' `python -m tff_comp.binaries.worker --port=PORT`.'
      )
    time.sleep(_POLL_SECONDS)
  local_worker.shutdown_local_runtime()
  tff.framework.set_default_context(_WatchedContext(stubs, deadline_seconds))


def check_mergeable(process) -> None:
  """NotMergeableError unless `process.next` splits across workers (one aggregation
  stage per round)."""
  try:
    tff.backends.native.compile_to_mergeable_comp_form(process.next)
  except ValueError as error:
    raise NotMergeableError(
      'its round has more than one aggregation stage (e.g. the round reference loss'
      ' of DRFL/DA-MAML, a maximum over clients before the mean), which TFF cannot'
      ' split across workers; run it on one worker or in-process.'
    ) from error


def start_local_workers(count: int) -> tuple[list[str], list[subprocess.Popen]]:
  """`count` workers on this machine (killed when Python exits), their loopback
  addresses and processes (tests and benchmarks; on several hosts start
  `tff_comp.binaries.worker` on each)."""
  ports = [portpicker.pick_unused_port() for _ in range(count)]
  processes = [local_worker.spawn_worker(port) for port in ports]
  return [f'localhost:{port}' for port in ports], processes
