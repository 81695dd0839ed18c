"""Test-wide setup: quiet TensorFlow, private data cache, a core per test process, and no
leftover TFF worker or Ray process of the session's own."""

import os
import pathlib
import signal
import tempfile
import uuid

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
os.environ.setdefault(
  'TFF_COMP_DATA_DIR', os.path.join(tempfile.gettempdir(), 'tff_comp_test_data')
)

# Under pytest-xdist with a test process a core (`make test`: 2 on 2), each process keeps
# to its own core, and the runs a test starts inherit it: TensorFlow sizes its thread
# pools and the lanes engine its kernels by the cores a process may use, so two processes
# each on both cores contended (the suite 503 -> 460 s on the project's 2-core machine).
_WORKER, _WORKERS = (
  os.environ.get('PYTEST_XDIST_WORKER'),
  os.environ.get('PYTEST_XDIST_WORKER_COUNT'),
)
if _WORKER and _WORKERS and hasattr(os, 'sched_setaffinity'):
  _CORES = sorted(os.sched_getaffinity(0))
  if int(_WORKERS) >= len(_CORES) > 1:
    os.sched_setaffinity(0, {_CORES[int(_WORKER.removeprefix('gw')) % len(_CORES)]})

# Marks every process the session starts (`workers.SESSION`); test processes of one
# session (pytest-xdist's) inherit the controller's mark.
os.environ.setdefault('TFF_COMP_TEST_SESSION', uuid.uuid4().hex)

# A suite started with Ctrl-C ignored (in the background of a non-interactive shell, under
# nohup) would hand that on to every run it starts, and the tests that send a run SIGINT
# would wait for nothing: the runs the tests start get Python's own Ctrl-C handling.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
  signal.signal(signal.SIGINT, signal.default_int_handler)

# pylint: disable=g-import-not-at-top,wrong-import-position
import numpy as np
import pytest

from tests import workers
from tff_comp import runtime

# Tests run TFF computations on the local worker that dies with Python.
runtime.install_local_runtime()

_SESSION_START = {}


def pytest_sessionstart(session):
  del session
  _SESSION_START['workers'] = set(workers.worker_pids())
  _SESSION_START['ray'] = set(workers.ray_pids())


def pytest_sessionfinish(session, exitstatus):
  """Fails the run if a TFF worker started during the session is still alive. Under
  pytest-xdist each test process stops its own worker and the controller, which ends
  after them, checks."""
  del exitstatus
  runtime.shutdown_local_runtime()
  if hasattr(session.config, 'workerinput'):  # an xdist test process
    return
  mark = os.environ[workers.SESSION]
  left = set(
    workers.wait_for_exit(
      exclude=_SESSION_START.get('workers', set()), find=lambda: workers.worker_pids(mark)
    )
  )
  if left:
    print(f'\nERROR: TFF worker process(es) left running: {sorted(left)}')
    session.exitstatus = 1
  left = set(
    workers.wait_for_exit(
      exclude=_SESSION_START.get('ray', set()),
      timeout=15.0,
      find=lambda: workers.ray_pids(mark),
    )
  )
  if left:
    print(f'\nERROR: Ray process(es) left running: {sorted(left)}')
    session.exitstatus = 1


@pytest.fixture(scope='session')
def repo_root() -> pathlib.Path:
  return pathlib.Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _fresh_module_rng(request):
  """A test module's `RNG` restarts at its `RNG_SEED` before every test, so each test
  draws the same inputs whichever tests run before it (-k, -x)."""
  seed = getattr(request.module, 'RNG_SEED', None)
  if seed is not None:
    request.module.RNG = np.random.default_rng(seed)
