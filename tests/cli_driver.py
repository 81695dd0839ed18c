"""Runs binaries/run.py's flag parsing and main on many command lines in one process
(each would otherwise pay a fresh interpreter's TensorFlow import): argv[1] is a JSON
list of argument lists; prints a JSON list of [exit status, stdout, stderr]."""

import contextlib
import io
import json
import sys

from absl import flags

from tff_comp.binaries import flags_lib, run


def main() -> None:
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
