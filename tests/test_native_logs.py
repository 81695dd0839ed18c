"""native_logs: TensorFlow's C++ start-up notices kept out of a session that imports
tff_comp, its real errors and Python's warnings kept, nothing changed when the user set
TF_CPP_MIN_LOG_LEVEL."""

import os
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
