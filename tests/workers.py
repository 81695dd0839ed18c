"""Finding TFF worker and Ray processes (by their command line, from /proc)."""

import os
import time

# A command line containing any of these is one of Ray's processes (its GCS server,
# raylet, and the workers running actors and tasks).
_RAY = (b'gcs_server', b'raylet', b'ray/_private/workers/default_worker.py')


def worker_pids() -> list[int]:
  """Pids of live (non-zombie) TFF worker_binary processes on this machine."""
  return _pids(lambda cmdline: b'worker_binary' in cmdline and b'tensorflow_federated' in cmdline)


def ray_pids() -> list[int]:
  """Pids of live (non-zombie) Ray processes on this machine."""
  return _pids(lambda cmdline: any(name in cmdline for name in _RAY))


def _pids(matches) -> list[int]:
  pids = []
  for entry in os.listdir('/proc'):
    if not entry.isdigit():
      continue
    try:
      with open(f'/proc/{entry}/cmdline', 'rb') as f:
        cmdline = f.read()
      with open(f'/proc/{entry}/stat', 'rb') as f:
        state = f.read().rsplit(b')', 1)[1].split()[0]
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
