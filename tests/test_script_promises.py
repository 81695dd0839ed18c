"""The library's promises in a researcher's own script, outside run.py (#75): a process
from `build_fedavg` run in process through the public training loop checkpoints, is
killed, and resumes to the uninterrupted run's rows and model, bit for bit (the recipe
of docs/long-runs.md, 'From your own script')."""

import csv
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from tests import workers

# The docs' recipe; kill_after > 0 kills the script (SIGKILL) in the round after that
# round's checkpoint (saves run in the background; the next save waits for it).
_SCRIPT = """
import os, pathlib, signal, sys, time
import numpy as np, tensorflow as tf, tensorflow_federated as tff
import tff_comp as tc
from tff_comp.algorithms import fedavg
from tff_comp.run import callbacks, checkpoints, training_loop

tf.keras.utils.set_random_seed(0)  # the same initial model in every process
keras = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(3)])
model = tc.models.keras_classifier(keras, 4)
rng = np.random.default_rng(0)
client_data = tff.simulation.datasets.TestClientData({{
  f'c{{i}}': (rng.normal(size=(6, 4)).astype(np.float32), rng.integers(0, 3, 6).astype(np.int32))
  for i in range(5)
}})

process = fedavg.build_fedavg(model, client_learning_rate=0.1, batch_size=2)
runtime, why = tc.runner_for(process, client_data, 'inprocess')


class KillAfter(callbacks.Callback):
  def after_round(self, loop, round_num, metrics):
    if round_num == {kill_after} + 1:
      saved = pathlib.Path({out!r}) / 'checkpoints' / 'state_{kill_after}.npz'
      while not saved.exists():  # written in the background, then renamed into place
        time.sleep(0.05)
      os.kill(os.getpid(), signal.SIGKILL)


training_loop.run_simulation(
  runtime,
  client_ids=client_data.client_ids,
  rounds=6,
  clients_per_round=3,
  seed=1,
  output_dir=pathlib.Path({out!r}),
  config={{'script': 'mine'}},
  callbacks=[KillAfter()] if {kill_after} else [],
  checkpoints=checkpoints.CheckpointOptions(checkpoint_every=2),
  resume=True,
)
print('done', flush=True)
"""


def _start(tmp_path, out, kill_after=0) -> subprocess.Popen:
  path = tmp_path / f'script_{kill_after}_{out.name}.py'
  path.write_text(_SCRIPT.format(out=str(out), kill_after=kill_after))
  return subprocess.Popen(
    [sys.executable, str(path)],
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
    cwd=tmp_path,
    stdin=subprocess.DEVNULL,
    env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3'),
  )


def _finish(process: subprocess.Popen) -> tuple[int, str, str]:
  stdout, stderr = process.communicate(timeout=180)
  return process.returncode, stdout, stderr[-2000:]


def _rows(out):
  with open(out / 'metrics.csv', newline='') as f:
    return [{k: v for k, v in row.items() if 'seconds' not in k} for row in csv.DictReader(f)]


def test_a_scripts_run_killed_and_resumed_ends_as_an_uninterrupted_one(tmp_path):
  whole, killed = _start(tmp_path, tmp_path / 'whole'), _start(tmp_path, tmp_path / 'cut', 2)
  status, stdout, stderr = _finish(whole)
  assert status == 0 and 'done' in stdout, stderr
  status, _, stderr = _finish(killed)
  assert status == -signal.SIGKILL, stderr
  assert not (tmp_path / 'cut' / 'final_model.npz').exists()
  status, stdout, stderr = _finish(_start(tmp_path, tmp_path / 'cut'))
  assert status == 0 and 'done' in stdout, stderr
  assert 'resuming from round 2' in stdout
  assert _rows(tmp_path / 'cut') == _rows(tmp_path / 'whole')
  assert len(_rows(tmp_path / 'whole')) == 7  # rounds 0 to 6
  with np.load(tmp_path / 'whole' / 'final_model.npz') as a:
    with np.load(tmp_path / 'cut' / 'final_model.npz') as b:
      assert sorted(a) == sorted(b)
      for name in a:
        np.testing.assert_array_equal(a[name], b[name])
  orphans = [
    p for p in workers.worker_pids(os.environ[workers.SESSION]) if workers.parent_of(p) == 1
  ]
  assert not orphans  # the scripts' TFF workers (if any started) died with them


# A script running FedAvg's rounds on a local Ray cluster of one actor from Python; it
# prints its Ray processes' pids once a round ran, then exits or is killed.
_RAY_SCRIPT = """
import os, signal, sys
import psutil
import tff_comp as tc
from tests import algorithm_cases

algorithm = algorithm_cases.algorithm('fedavg', dict(client_learning_rate=0.05))
data = algorithm_cases.DATA['unequal']
runtime, why = tc.runner_for(algorithm, data, 'ray', ray_address='local', ray_actors=1)
state = runtime.initialize()
state = runtime.next(state, list(data.client_ids)[:3]).state
ray = [p.pid for p in psutil.Process().children(recursive=True)
       if any(name in ' '.join(p.cmdline()) for name in ('raylet', 'gcs_server'))]
print('ran', *ray, flush=True)
if {kill}:
  os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.ray  # make test-ray (28 s)
def test_a_scripts_ray_cluster_is_gone_after_it_exits_or_is_killed(repo_root, tmp_path):
  """Both scripts at once: each started a local Ray cluster (raylet among its
  children); none of its processes is left soon after the script ended (60 s at most)."""
  running = {}
  for kill in (False, True):
    path = tmp_path / f'ray_{kill}.py'
    path.write_text(_RAY_SCRIPT.format(kill=kill))
    running[kill] = subprocess.Popen(
      [sys.executable, str(path)],
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      stdin=subprocess.DEVNULL,
      text=True,
      cwd=tmp_path,
      env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3', PYTHONPATH=str(repo_root)),
    )
  for kill, process in running.items():
    stdout, stderr = process.communicate(timeout=120)
    ran = [line for line in stdout.splitlines() if line.startswith('ran')]
    assert ran, stderr[-2000:]
    assert process.returncode == (-signal.SIGKILL if kill else 0), stderr[-2000:]
    pids = {int(pid) for pid in ran[0].split()[1:]}
    assert pids, 'the script started no Ray cluster: nothing was checked'
    left = workers.wait_for_exit(
      timeout=60.0, find=lambda pids=pids: [p for p in workers.ray_pids() if p in pids]
    )
    assert not left, (kill, left)
