"""The TFF worker started through tff_comp dies with its Python process, however it ends."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tests import workers

_CHILD = textwrap.dedent('''
    import sys
    import tensorflow_federated as tff
    import tff_comp
    @tff.tensorflow.computation
    def one():
      return 1
    assert one() == 1
    print(tff_comp.runtime.worker_pids()[0], flush=True)
    how = sys.stdin.readline().strip()  # the test says how to end, or signals us
    if how == 'exception':
      raise RuntimeError('boom')
''')


@pytest.mark.parametrize('how', ['exit', 'exception', 'SIGTERM', 'SIGKILL', 'SIGINT'])
def test_worker_dies_with_python(how):
  child = subprocess.Popen(
      [sys.executable, '-c', _CHILD], stdin=subprocess.PIPE,
      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
      env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3'))
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
