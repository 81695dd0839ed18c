"""The TFF worker started through tff_comp dies with its Python process, however it ends."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tests import workers

_CHILD = textwrap.dedent("""
    import sys
    import tensorflow_federated as tff
    import tff_comp.runtime
    tff_comp.runtime.install_local_runtime()
    @tff.tensorflow.computation
    def one():
      return 1
    assert one() == 1
    print(tff_comp.runtime.worker_pids()[0], flush=True)
    how = sys.stdin.readline().strip()  # the test says how to end, or signals us
    if how == 'exception':
      raise RuntimeError('boom')
""")


@pytest.mark.parametrize(
  'how',  # an exception's and SIGINT's ends are exit's (Python's own); the signals' ends
  # are tests/test_worker_lifetime.py's too, there with the worker TFF's import context
  # starts (the same spawn_worker): make test-slow
  [
    'exit',
    pytest.param('exception', marks=pytest.mark.slow),
    pytest.param('SIGTERM', marks=pytest.mark.slow),
    pytest.param('SIGKILL', marks=pytest.mark.slow),
    pytest.param('SIGINT', marks=pytest.mark.slow),
  ],
)
def test_worker_dies_with_python(how):
  child = subprocess.Popen(
    [sys.executable, '-c', _CHILD],
    stdin=subprocess.PIPE,
    stdout=subprocess.PIPE,
    stderr=subprocess.DEVNULL,
    text=True,
    env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3'),
  )
  worker = int(child.stdout.readline())
  assert worker in workers.worker_pids()
  if how.startswith('SIG'):
    child.send_signal(getattr(signal, how))
  else:
    child.stdin.write(how + '\n')
    child.stdin.flush()
  # The pipe closes only when every holder exits: a worker holding it would hang here.
  child.communicate(timeout=60)
  deadline = time.monotonic() + 10
  while worker in workers.worker_pids() and time.monotonic() < deadline:
    time.sleep(0.1)
  assert worker not in workers.worker_pids()


def test_import_swaps_only_tffs_own_context_and_starts_no_worker():
  """Importing tff_comp (and every submodule, TFF first) makes TFF's default context the
  local runtime whose worker dies with Python, in place of the one TFF's import set; no
  worker starts until a computation runs (tests/test_worker_lifetime.py: the endings)."""
  code = textwrap.dedent("""
      import pkgutil, importlib
      import tensorflow_federated as tff
      before = tff.framework.get_context_stack().current
      import tff_comp
      for m in pkgutil.walk_packages(tff_comp.__path__, 'tff_comp.'):
        importlib.import_module(m.name)
      from tff_comp.runtime import local_worker
      assert tff.framework.get_context_stack().current is not before
      assert not local_worker._is_tffs_import_context(tff.framework.get_context_stack().current)
      assert not tff_comp.runtime.worker_pids()
      print('swapped')
  """)
  out = subprocess.run(
    [sys.executable, '-c', code],
    capture_output=True,
    text=True,
    timeout=300,
    env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3'),
  )
  assert out.stdout.strip() == 'swapped', out.stderr[-2000:]


def test_math_layer_imports_no_tff():
  """tff_comp.ops (the math any runtime runs) imports without TensorFlow Federated."""
  code = textwrap.dedent("""
      import pkgutil, importlib, sys
      import tff_comp.ops
      for m in pkgutil.walk_packages(tff_comp.ops.__path__, 'tff_comp.ops.'):
        importlib.import_module(m.name)
      print('tff' if 'tensorflow_federated' in sys.modules else 'no tff')
  """)
  out = subprocess.run(
    [sys.executable, '-c', code],
    capture_output=True,
    text=True,
    timeout=300,
    env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3'),
  )
  assert out.stdout.strip() == 'no tff', out.stderr[-2000:]


def test_the_leftover_check_counts_only_the_sessions_own_processes():
  """The suite failed on a shared machine for Ray processes of other jobs (#58)."""
  mine = os.environ[workers.SESSION]
  others = [
    subprocess.Popen(
      [sys.executable, '-c', 'import time; time.sleep(60)', 'raylet'],
      env=dict(os.environ, **{workers.SESSION: mark}),
    )
    for mark in (mine, 'another-session')
  ]
  try:
    deadline = time.monotonic() + 30
    while not {p.pid for p in others} <= set(workers.ray_pids()):
      assert time.monotonic() < deadline
      time.sleep(0.05)
    found = set(workers.ray_pids(mine))
    assert others[0].pid in found and others[1].pid not in found
  finally:
    for p in others:
      p.kill()
      p.wait()
