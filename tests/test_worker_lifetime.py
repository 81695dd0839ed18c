"""A researcher's own script (no run.py): TFF's worker dies with it, however it ends.

The script of issue #75: a Keras model as a TFF functional model, `build_fedavg`,
`initialize()`, `next()` on TFF's default context. Its stdout and stderr are pipes read
to their end, as `python t.py | cat` does: a worker that outlived the script would hold
them open and the read would never end.
"""

import os
import signal
import subprocess
import sys
import textwrap

import pytest
import tensorflow_federated as tff

from tests import workers
from tff_comp.runtime import local_worker

# Trains one round on TFF's runtime, prints the pids of its TFF workers, then ends as
# ENDING says.
_SCRIPT = """
import os, signal, sys
import numpy as np, tensorflow as tf, tensorflow_federated as tff
{import_order}
sys.path.insert(0, {repo!r})
from tests import workers

keras = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(3)])
spec = (tf.TensorSpec([None, 4], tf.float32), tf.TensorSpec([None], tf.int32))
fm = tff.learning.models.functional_model_from_keras(
  keras, tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True), spec)
rng = np.random.default_rng(0)
ds = [tf.data.Dataset.from_tensor_slices((rng.normal(size=(6, 4)).astype(np.float32),
      rng.integers(0, 3, 6).astype(np.int32))) for _ in range(3)]
p = fedavg.build_fedavg(fm, client_learning_rate=0.1, batch_size=2)
s = p.initialize(); s = p.next(s, ds).state
print('trained', *workers.workers_of(os.getpid()), flush=True)
ending = {ending!r}
if ending == 'raise':
  raise RuntimeError('the script failed after training')
if ending != 'exit':
  os.kill(os.getpid(), getattr(signal, ending))
"""
_TFF_FIRST = 'from tff_comp.algorithms import fedavg'
_TFF_COMP_FIRST = 'import tff_comp'  # then TFF, then the builder
_EXIT_STATUS = {
  'exit': 0,
  'raise': 1,
  'SIGTERM': -signal.SIGTERM,
  'SIGINT': -signal.SIGINT,  # KeyboardInterrupt's traceback, then Python re-raises SIGINT
  'SIGKILL': -signal.SIGKILL,
}


def _start(tmp_path, name: str, script: str) -> subprocess.Popen:
  """`script` running with both outputs piped (as `python t.py | cat`)."""
  path = tmp_path / f'{name}.py'
  path.write_text(script)
  env = {k: v for k, v in os.environ.items() if k != 'TF_CPP_MIN_LOG_LEVEL'}
  return subprocess.Popen(
    [sys.executable, str(path)],
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    stdin=subprocess.DEVNULL,
    text=True,
    cwd=tmp_path,
    env=env,
  )


def _finish(process: subprocess.Popen) -> tuple[int, str, list[int]]:
  """Reads both pipes to their end (90 s at most): the exit status, stderr and the
  worker pids the script printed. Pipes still open then fail the test, after the
  session's workers left are killed (the suite's own guard would fail on them)."""
  try:
    stdout, stderr = process.communicate(timeout=90)
  except subprocess.TimeoutExpired:
    left = [  # orphans only: the test process's own worker is not the scripts'
      p for p in workers.worker_pids(os.environ[workers.SESSION]) if workers.parent_of(p) == 1
    ]
    for pid in left:
      os.kill(pid, signal.SIGKILL)
    process.kill()
    pytest.fail(f'the pipes stayed open 90 s after the script started (workers: {left})')
  trained = [line for line in stdout.splitlines() if line.startswith('trained')]
  assert trained, stdout + stderr
  return process.returncode, stderr, [int(pid) for pid in trained[0].split()[1:]]


def _alive(pids: list[int]) -> list[int]:
  """Of `pids`, the workers still alive once they had 30 s to go (they go at once)."""
  return workers.wait_for_exit(
    timeout=30.0, find=lambda: [p for p in workers.worker_pids() if p in pids]
  )


def _check_endings(repo_root, tmp_path, endings: list[str]) -> None:
  """The scripts ending each way in `endings` (and 'tff_comp first', an exit) run at
  once (each mostly imports and traces); each ends with its status, its workers gone."""
  scripts = {
    ending: _SCRIPT.format(import_order=_TFF_FIRST, repo=str(repo_root), ending=ending)
    for ending in endings
  }
  if 'tff_comp first' in endings:
    scripts['tff_comp first'] = f'{_TFF_COMP_FIRST}\n{scripts["exit"]}'
  running = {ending: _start(tmp_path, ending.replace(' ', '_'), s) for ending, s in scripts.items()}
  for ending, process in running.items():
    status, stderr, pids = _finish(process)
    assert pids, f'{ending}: the script ran no TFF worker, so nothing was checked'
    assert status == _EXIT_STATUS.get(ending, 0), f'{ending}: {stderr}'
    assert not _alive(pids), f'{ending}: worker(s) {pids} outlived the script'


def test_a_plain_scripts_worker_dies_with_it_in_each_ending(repo_root, tmp_path):
  """Exit, SIGTERM and SIGKILL, and tff_comp imported before TFF. (An exception and
  SIGINT end through Python's exit as `exit` does, atexit hooks and all: the slow suite
  runs them.)"""
  _check_endings(repo_root, tmp_path, ['exit', 'SIGTERM', 'SIGKILL', 'tff_comp first'])


@pytest.mark.slow
def test_a_plain_scripts_worker_dies_with_it_after_an_exception_or_ctrl_c(repo_root, tmp_path):
  _check_endings(repo_root, tmp_path, ['raise', 'SIGINT'])


def test_a_context_the_researcher_set_stays(repo_root, tmp_path):
  """A context set before tff_comp's import (TFF's test context, sharing the import
  context's executors) and one set after both stay the default."""
  script = textwrap.dedent(
    """
    import tensorflow_federated as tff
    from tensorflow_federated.python.core.impl.context_stack import context_stack_impl
    mine = tff.backends.test.create_sync_test_cpp_execution_context()
    tff.framework.set_default_context(mine)
    import tff_comp.algorithms
    print('before', context_stack_impl.context_stack.current is mine)
    later = tff.backends.test.create_sync_test_cpp_execution_context()
    tff.framework.set_default_context(later)
    import tff_comp.experiment
    print('after', context_stack_impl.context_stack.current is later)
    """
  )
  (tmp_path / 'c.py').write_text(script)
  out = subprocess.run(
    [sys.executable, str(tmp_path / 'c.py')], capture_output=True, text=True, timeout=60
  )
  assert out.stdout.split() == ['before', 'True', 'after', 'True'], out.stderr


def test_tffs_import_context_is_told_apart_from_its_test_context():
  assert local_worker._is_tffs_import_context(
    tff.backends.native.create_sync_local_cpp_execution_context()
  )
  assert not local_worker._is_tffs_import_context(
    tff.backends.test.create_sync_test_cpp_execution_context()
  )
  stub = local_worker.execution_context(lambda: None, tff.framework.SyncExecutionContext)
  assert not local_worker._is_tffs_import_context(stub)
