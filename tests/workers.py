"""Finding TFF worker and Ray processes (by their command line, from /proc)."""

import os
import time

# A command line containing any of these is one of Ray's processes (its GCS server,
# raylet, and the workers running actors and tasks).
_RAY = (b'gcs_server', b'raylet', b'ray/_private/workers/default_worker.py')


# The test session's mark, in the environment of every process it starts (test processes,
# runs, TFF workers, Ray's processes all inherit it): the leftover checks count only the
# session's own, not other jobs' on a shared machine.
SESSION = 'TFF_COMP_TEST_SESSION'


def worker_pids(session: str | None = None) -> list[int]:
  """Pids of live (non-zombie) TFF worker_binary processes on this machine (of the test
  session `session` only, if given)."""
  return _pids(
    lambda cmdline: b'worker_binary' in cmdline and b'tensorflow_federated' in cmdline, session
  )


def ray_pids(session: str | None = None) -> list[int]:
  """Pids of live (non-zombie) Ray processes on this machine (of `session` only, if
  given)."""
  return _pids(lambda cmdline: any(name in cmdline for name in _RAY), session)


def _pids(matches, session: str | None = None) -> list[int]:
  mark = None if session is None else f'{SESSION}={session}'.encode()
  pids = []
  for entry in os.listdir('/proc'):
    if not entry.isdigit():
      continue
    try:
      with open(f'/proc/{entry}/cmdline', 'rb') as f:
        cmdline = f.read()
      with open(f'/proc/{entry}/stat', 'rb') as f:
        state = f.read().rsplit(b')', 1)[1].split()[0]
      if mark is not None and matches(cmdline):
        with open(f'/proc/{entry}/environ', 'rb') as f:
          if mark not in f.read().split(b'\0'):
            continue
    except OSError:
      continue
    if matches(cmdline) and state != b'Z':
      pids.append(int(entry))
  return pids


def wait_for_exit(exclude=frozenset(), timeout: float = 5.0, find=worker_pids) -> list[int]:
  """Processes `find` finds (TFF workers by default; other than `exclude`) still alive
  after up to `timeout` seconds."""
  deadline = time.monotonic() + timeout
  while True:
    left = [p for p in find() if p not in exclude]
    if not left or time.monotonic() > deadline:
      return left
    time.sleep(0.1)


def parent_of(pid: int) -> int | None:
  try:
    with open(f'/proc/{pid}/stat', 'rb') as f:
      return int(f.read().rsplit(b')', 1)[1].split()[1])
  except OSError:
    return None


def workers_of(parent: int) -> list[int]:
  """Live workers whose parent is `parent`."""
  return [p for p in worker_pids() if parent_of(p) == parent]
