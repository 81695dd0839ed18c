"""Runs binaries/run.py's flag parsing and main on many command lines in one process
(each would otherwise pay a fresh interpreter's TensorFlow import): argv[1] is a JSON
list of argument lists; prints a JSON list of [exit status, stdout, stderr].
`run_all` starts it from a test."""

import contextlib
import io
import json
import pathlib
import subprocess
import sys


def run_all(cases: list[list[str]], *, cwd: pathlib.Path, env: dict[str, str]) -> list[list]:
  """[exit status, stdout, stderr] of each command line in `cases`, run by this driver in
  one fresh interpreter (run.py's flags stay out of the test's own)."""
  out = subprocess.run(
    [sys.executable, '-m', 'tests.cli_driver', json.dumps(cases)],
    capture_output=True,
    text=True,
    timeout=900,
    env=env,
    cwd=cwd,
    stdin=subprocess.DEVNULL,
  )
  assert out.returncode == 0, out.stderr[-2000:]
  return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
  # Imported here: a test importing `run_all` must not define run.py's flags.
  from absl import flags

  from tff_comp.binaries import flags_lib, run

  results = []
  for args in json.loads(sys.argv[1]):
    flags.FLAGS.unparse_flags()
    out, err, status = io.StringIO(), io.StringIO(), 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
      try:
        run.main(flags_lib.parse_or_fail(['run.py', *args]))
      except SystemExit as e:
        status = e.code
    results.append([status, out.getvalue(), err.getvalue()])
  print(json.dumps(results))


if __name__ == '__main__':
  main()
