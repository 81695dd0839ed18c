"""What absl handles badly is one line, exit 2, before anything heavy loads
(`binaries/flag_check.py`): a flag name too long to be one, a flagfile including itself."""

import subprocess
import sys

import pytest

from tff_comp.binaries import flag_check


def _refused(argv, capsys) -> str:
  with pytest.raises(SystemExit) as stop:
    flag_check.check_shape(argv)
  assert stop.value.code == 2
  lines = capsys.readouterr().err.strip().splitlines()
  assert len(lines) == 1, lines
  return lines[0]


def test_a_flagfile_including_itself_is_refused(tmp_path, capsys, monkeypatch):
  monkeypatch.chdir(tmp_path)  # absl reads nested flagfiles relative to the cwd
  (tmp_path / 'a.flags').write_text(
    '# usage: run.py --flagfile=a.flags\n--rounds=3\n--flagfile=b.flags\n'
  )
  (tmp_path / 'b.flags').write_text('# comment\n--flagfile=a.flags\n')
  line = _refused(['run.py', '--flagfile=a.flags'], capsys)
  assert 'includes itself (a.flags -> b.flags -> a.flags)' in line
  (tmp_path / 'c.flags').write_text('--flagfile=c.flags\n')
  assert 'includes itself (c.flags -> c.flags)' in _refused(
    ['run.py', '--flagfile', 'c.flags'], capsys
  )
  (tmp_path / 'b.flags').write_text('--seed=1\n')  # a chain without a cycle passes
  flag_check.check_shape(['run.py', '--flagfile=a.flags'])


def test_a_flag_name_too_long_to_be_one_is_one_line(repo_root):
  """absl's suggestions for an unknown 5,000-character name raised RecursionError."""
  done = subprocess.run(
    [sys.executable, str(repo_root / 'binaries' / 'run.py'), '--' + 'x' * 5000],
    capture_output=True,
    text=True,
    timeout=120,
    cwd=repo_root,
    stdin=subprocess.DEVNULL,
  )
  assert done.returncode == 2, done.stderr
  lines = done.stderr.strip().splitlines()
  assert len(lines) == 1 and 'a name of 5000 characters' in lines[0], lines
