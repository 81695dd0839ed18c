"""Ctrl-C (SIGINT) and SIGTERM (a scheduler's preemption notice) stop a run at the end of
the round they arrive in, as an interrupted run: the last finished round is saved. A
second signal stops at once (KeyboardInterrupt).

Why not at once: raising where the signal lands could be inside TensorFlow's C code
(an interrupt turned into a TypeError about the eager context, seen once in the tests)
or in a garbage-collection callback, where Python ignores it (Ctrl-C during a run's
startup was swallowed and the run trained on). Light on purpose (no TensorFlow): a
binary installs it before its slow imports.
"""

from collections.abc import Iterator
import contextlib
import ctypes
import os
import signal
import sys
import threading

_HANDLED = (signal.SIGINT, signal.SIGTERM)
_PR_SET_PDEATHSIG = 1  # prctl's option (linux/prctl.h)
_requested: list[str] = []  # the first signal's name, until `stop_at_round_end` ends
_received: list[str] = []  # the first signal's name, for the process's life (`received`)
_starting: list[str] = []  # the program installing at its start, until its run begins


def exit_code(name: str) -> int:
  """A shell's exit status for a run stopped by signal `name`: 130 or 143."""
  return 143 if name == 'SIGTERM' else 130


def stopped_before_training(program: str, name: str) -> str:
  """The one line of a run stopped by a second signal before it trained."""
  how = 'terminated (SIGTERM)' if name == 'SIGTERM' else 'interrupted'
  return f'{program}: {how} before training; nothing was saved.'


def _request(signum, frame) -> None:
  del frame
  name = signal.Signals(signum).name
  _received[:] = _received or [name]
  if not _requested:
    _requested.append(name)
    return
  if _starting:  # still importing: one line, no traceback, nothing to save
    print(stopped_before_training(_starting[0], name), file=sys.stderr, flush=True)
    # Not SystemExit: raised in a garbage-collection callback (JAX's, while TFF loads)
    # Python ignores it with a traceback and the run went on. Nothing is open yet that
    # an exit must close (a TFF worker dies with its parent: `local_worker`).
    os._exit(exit_code(name))
  raise KeyboardInterrupt(name)


def install(program: str = '') -> None:
  """From now on in this process (a binary's `__main__`, before its slow imports),
  signals stop the run at the end of its round; a second one before the run begins
  (`stop_at_round_end`) exits with one line naming `program`."""
  if program:
    _starting[:] = [program]
  for sig in _HANDLED:
    signal.signal(sig, _request)


@contextlib.contextmanager
def stop_at_round_end() -> Iterator[None]:
  """`install` while the context runs (the main thread only), the earlier handlers
  restored after, and a request not taken forgotten."""
  if threading.current_thread() is not threading.main_thread():
    yield
    return
  earlier = {sig: signal.getsignal(sig) for sig in _HANDLED}
  _starting.clear()
  install()
  try:
    yield
  finally:
    for sig, handler in earlier.items():
      if handler is not None:
        signal.signal(sig, handler)
    _requested.clear()


def stop_if_requested() -> None:
  """Raises KeyboardInterrupt(name) if a signal asked the run to stop: a run still
  starting stops between its steps, before the first round (under load, a build and
  a first round took minutes after a Ctrl-C)."""
  if _requested:
    raise KeyboardInterrupt(_requested[0])


def requested() -> str | None:
  """The signal asking the runs to stop ('SIGINT', 'SIGTERM'), None if none: every run
  of the process sees it (the trials of a batched grid each stop at their round's end),
  until `stop_at_round_end` ends."""
  return _requested[0] if _requested else None


def received() -> str | None:
  """The first signal this process took since `install` ('SIGINT', 'SIGTERM'; None if
  none), kept after its run stopped: a process serving several runs (a grid's) starts
  no other."""
  return _received[0] if _received else None


def on_parent_death(sig: int) -> None:
  """Linux: the kernel sends this process `sig` when the thread that started it ends
  (`PR_SET_PDEATHSIG`, as a child's parent dies by any means); elsewhere nothing."""
  if sys.platform.startswith('linux'):
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)
