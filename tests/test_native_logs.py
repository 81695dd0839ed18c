"""native_logs: TensorFlow's C++ start-up notices kept out of a session that imports
tff_comp, its real errors and Python's warnings kept, nothing changed when the user set
TF_CPP_MIN_LOG_LEVEL; Ray's one line about its metrics agent kept out (`drop_line`)."""

import os
import re
import subprocess
import sys

import pytest

# A stand-in `tensorflow` writing to fd 2 as the C++ runtime does at import.
_FAKE_TF = (
  'import os, sys\n'
  "os.write(2, b'2026-11-28 E cuda_dnn.cc:9342] Unable to register cuDNN factory: x\\n')\n"
  "os.write(2, b'2026-11-28 E real_failure.cc:1] something that matters\\n')\n"
  "os.write(2, b'2026-11-28 I cpu_feature_guard.cc:182] This TensorFlow binary is optimized\\n')\n"
  "print('a Python warning', file=sys.stderr)\n"
)


@pytest.mark.parametrize('user_level', [None, '0'])
def test_start_up_notices_go_and_errors_stay(repo_root, tmp_path, user_level):
  (tmp_path / 'tensorflow').mkdir()
  (tmp_path / 'tensorflow' / '__init__.py').write_text(_FAKE_TF)
  env = {k: v for k, v in os.environ.items() if k != 'TF_CPP_MIN_LOG_LEVEL'}
  env['PYTHONPATH'] = os.pathsep.join([str(tmp_path), str(repo_root)])
  if user_level is not None:
    env['TF_CPP_MIN_LOG_LEVEL'] = user_level
  out = subprocess.run(
    [sys.executable, '-c', 'import tff_comp, tensorflow; print("imported")'],
    capture_output=True,
    text=True,
    timeout=60,
    env=env,
    cwd=tmp_path,
  )
  assert out.returncode == 0 and out.stdout == 'imported\n', out.stderr
  lines = out.stderr.splitlines()
  if user_level is None:
    assert lines == ['2026-11-28 E real_failure.cc:1] something that matters', 'a Python warning']
  else:  # the user's choice: everything as TensorFlow printed it
    assert len(lines) == 4


# A line of TensorFlow's C++ logging: '2026-12-04 19:31:10.295662: I tensorflow/...'.
_CPP_LOG = re.compile(r'\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: [IWEF] ')
_API_RUN = """
from tff_comp import experiment
for where, runtime in (('a', dict(runtime='tff')), ('b', dict(engine='lanes'))):
  experiment.train(experiment.ExperimentConfig.of(
      algorithm='fedavg', task='lasso', rounds=1, output_dir={out!r} + where, **runtime))
"""


def test_a_script_prints_no_cpp_notices_on_either_runtime(tmp_path):
  """Through the Python API (no binary sets the level), TFF's runtime printed two
  grappler INFO lines a compiled computation (44 in 2 rounds of lasso), and the lanes
  kernel's first XLA compile two 'E ... SetPriority unimplemented' lines."""
  env = {k: v for k, v in os.environ.items() if k != 'TF_CPP_MIN_LOG_LEVEL'}
  out = subprocess.run(
    [sys.executable, '-c', _API_RUN.format(out=str(tmp_path / 'run'))],
    capture_output=True,
    text=True,
    timeout=300,
    env=env,
    cwd=tmp_path,
    stdin=subprocess.DEVNULL,
  )
  assert out.returncode == 0, out.stderr[-2000:]
  cpp = [line for line in out.stderr.splitlines() if _CPP_LOG.match(line)]
  assert not cpp, cpp[:5]


_DROP_LINE = (
  'import os, re, sys, time\n'
  'from tff_comp import native_logs\n'
  'before = os.fstat(2).st_ino\n'
  "native_logs.drop_line(re.compile('metrics exporter agent'), {seconds})\n"
  "os.write(2, b'E first.cc:1] a C++ line\\n')\n"
  "print('a Python line', file=sys.stderr, flush=True)\n"
  '{wait}'
  "os.write(2, b'E core_worker_process.cc:837: Failed to establish connection to the"
  " metrics exporter agent. Metrics will not be exported.\\n')\n"
  "os.write(2, b'E x.cc:2] metrics exporter agent, said again\\n')\n"
  'time.sleep(0.5)\n'
  "print('restored' if os.fstat(2).st_ino == before else 'still the pipe', flush=True)\n"
  "os.write(2, b'E y.cc:3] the last line\\n')\n"
  "sys.exit('exit message')\n"
)


@pytest.mark.parametrize('late', [False, True])
def test_the_one_line_is_dropped_while_it_may_come_and_nothing_else(repo_root, late):
  """Ray's driver logs the missing metrics agent once, about 30 s after it joined; the
  line is dropped, every other line passes in order (the exit's message too), and
  descriptor 2 is the real one again once it came. After the window the line passes."""
  script = _DROP_LINE.format(seconds=0.3 if late else 60, wait='time.sleep(0.6)\n' if late else '')
  out = subprocess.run(
    [sys.executable, '-c', script],
    capture_output=True,
    text=True,
    timeout=60,
    cwd=repo_root,
  )
  assert out.returncode == 1, out.stderr
  lines = out.stderr.splitlines()
  exporter = (
    'E core_worker_process.cc:837: Failed to establish connection to the metrics exporter'
    ' agent. Metrics will not be exported.'
  )
  assert lines == [
    'E first.cc:1] a C++ line',
    'a Python line',
    *([exporter] if late else []),
    'E x.cc:2] metrics exporter agent, said again',
    'E y.cc:3] the last line',
    'exit message',
  ], out.stderr
  assert out.stdout == 'restored\n', out.stdout


def test_what_the_pipe_holds_at_exit_reaches_the_real_descriptor(repo_root):
  """The line never came: descriptor 2 is still the pipe when the process ends, and the
  lines written last (many, quickly) all arrive."""
  script = (
    'import os, re, sys\n'
    'from tff_comp import native_logs\n'
    "native_logs.drop_line(re.compile('metrics exporter agent'), 60)\n"
    'for k in range(5000):\n'
    "  os.write(2, b'line %d\\n' % k)\n"
  )
  out = subprocess.run(
    [sys.executable, '-c', script], capture_output=True, text=True, timeout=60, cwd=repo_root
  )
  assert out.returncode == 0, out.stderr[-2000:]
  assert out.stderr.splitlines() == [f'line {k}' for k in range(5000)]
