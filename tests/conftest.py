"""Test-wide setup: quiet TensorFlow, private data cache, a core per test process, a
private working directory, and no leftover TFF worker or Ray process of the session's
own, nor any file of the checkout changed (the user's runs/ included)."""

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

_REPO = pathlib.Path(__file__).resolve().parent.parent

import numpy as np
import pytest

from tests import workers
from tff_comp import runtime

# Tests run TFF computations on the local worker that dies with Python.
runtime.install_local_runtime()

_SESSION_START = {}
# Not the checkout's: the environments, git's, caches and build outputs.
_NOT_CHECKED = {
  '.git',
  '.venv',
  '.venv-fedjax',
  '.venv-pfl',
  '.venv-flower',
  '.venv-types',
  '.mypy_cache',
  '__pycache__',
  '.pytest_cache',
  'build',
  '.ruff_cache',
}


def _checkout_files() -> dict[str, tuple[int, int]]:
  """{path: (size, mtime)} of every file in the checkout (runs/ and results/ included)."""
  files = {}
  for folder, dirs, names in os.walk(_REPO):
    dirs[:] = [d for d in dirs if d not in _NOT_CHECKED and not d.endswith('.egg-info')]
    for name in names:
      path = os.path.join(folder, name)
      try:
        stat = os.stat(path)
      except OSError:
        continue
      files[os.path.relpath(path, _REPO)] = (stat.st_size, stat.st_mtime_ns)
  return files


def pytest_sessionstart(session):
  del session
  _SESSION_START['workers'] = set(workers.worker_pids())
  _SESSION_START['ray'] = set(workers.ray_pids())
  _SESSION_START['files'] = _checkout_files()


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
  before, after = _SESSION_START['files'], _checkout_files()
  changed = sorted(
    path for path in before.keys() | after.keys() if before.get(path) != after.get(path)
  )
  if changed:
    print(f'\nERROR: the tests changed files of the checkout: {changed[:20]}')
    session.exitstatus = 1


@pytest.fixture(scope='session', autouse=True)
def _private_working_directory(tmp_path_factory):
  """Each test process works in a directory of its own once its tests are collected: a
  run given no output directory (`runs/<algo>-<task>`) lands there, never in the
  checkout's runs/, where the user's own runs live (a README example run before `make
  test` made a test fail on it, #76)."""
  before = os.getcwd()
  os.chdir(tmp_path_factory.mktemp('cwd'))
  yield
  os.chdir(before)


@pytest.fixture(scope='session')
def repo_root() -> pathlib.Path:
  return _REPO


@pytest.fixture(autouse=True)
def _fresh_module_rng(request):
  """A test module's `RNG` restarts at its `RNG_SEED` before every test, so each test
  draws the same inputs whichever tests run before it (-k, -x)."""
  seed = getattr(request.module, 'RNG_SEED', None)
  if seed is not None:
    request.module.RNG = np.random.default_rng(seed)
