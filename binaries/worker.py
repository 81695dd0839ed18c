r"""Starts one TFF worker (the `worker_binary` bundled with TFF) for `run.py --workers`.

    python -m tff_comp.binaries.worker --port=8000

Run it on each host named in `--workers=host:port,...`, in the foreground (it serves
until stopped). The worker listens on every interface of the host with no
authentication (the binary has no flag to bind one address): run it on a private
network or behind a firewall that admits only the machine running `run.py`. Clients
read their data where they run, so `$TFF_COMP_DATA_DIR` must hold the same task files
at the same path on every host (run the task once there, or copy the cache).
"""

import os
import sys

from absl import app, flags

from tff_comp.binaries import flag_check

_PORT = flags.DEFINE_integer(
  'port', 8000, 'Port the worker serves on.', lower_bound=1, upper_bound=65535
)


def _parse(argv: list[str]) -> list[str]:
  """A bad flag is one line and exit status 2, as in run.py (`flags_lib.parse_or_fail`,
  not imported here: it loads TensorFlow, which this launcher does not need)."""
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    flag_check.fail(e)


def main(argv):
  if len(argv) > 1:
    flag_check.fail(f'unexpected arguments: {" ".join(argv[1:])}')
  from tff_comp.runtime import local_worker

  binary = local_worker.WORKER_BINARY
  print(f'TFF worker on port {_PORT.value} ({binary}); Ctrl-C stops it.', flush=True)
  os.execv(binary, [binary, f'--port={_PORT.value}'])


if __name__ == '__main__':
  sys.exit(app.run(main, flags_parser=_parse))
