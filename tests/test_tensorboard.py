"""TensorBoard opens a finished run from the venv and serves metrics.csv's values."""

import csv
import json
import os
import pathlib
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

import portpicker
import pytest

from tff_comp import experiment

TAG = 'train/client_work/train_loss'


def _get(port: int, path: str, **query) -> dict | None:
  url = f'http://127.0.0.1:{port}{path}?{urllib.parse.urlencode(query)}'
  try:
    with urllib.request.urlopen(url, timeout=10) as response:
      return json.loads(response.read())
  except (urllib.error.URLError, ConnectionError):
    return None


def test_tensorboard_serves_the_runs_scalars(tmp_path):
  prepared = experiment.prepare(
    experiment.ExperimentConfig.of(
      algorithm='fedavg', task='quadratic', rounds=3, output_dir=str(tmp_path)
    )
  )
  experiment.run_experiment(prepared, show_progress=False)
  with open(tmp_path / 'metrics.csv') as f:
    written = {int(row['round']): float(row[TAG]) for row in csv.DictReader(f) if row[TAG]}
  assert len(written) == 3

  port = portpicker.pick_unused_port()
  tensorboard = pathlib.Path(sys.executable).parent / 'tensorboard'
  proc = subprocess.Popen(
    [str(tensorboard), f'--logdir={tmp_path}', '--host=127.0.0.1', f'--port={port}'],
    stdout=subprocess.DEVNULL,
    stderr=subprocess.PIPE,
    text=True,
    env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3'),
  )
  try:
    deadline, tags = time.monotonic() + 240, None
    while time.monotonic() < deadline and proc.poll() is None:
      tags = _get(port, '/data/plugin/scalars/tags')
      if tags and TAG in tags.get('tensorboard', {}):
        break
      time.sleep(0.5)
    if proc.poll() is not None:
      pytest.fail(f'tensorboard exited {proc.returncode}: {proc.stderr.read()[-2000:]}')
    assert tags and TAG in tags.get('tensorboard', {}), tags
    served = _get(port, '/data/plugin/scalars/scalars', run='tensorboard', tag=TAG)
    assert {step: value for _, step, value in served} == pytest.approx(written, rel=1e-6)
  finally:
    proc.kill()
    proc.wait(timeout=30)
