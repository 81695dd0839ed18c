"""TensorFlow's C++ start-up lines kept out of a user's session, real errors kept.

Importing TensorFlow 2.14 on a machine without CUDA prints about nine lines from C++ on
file descriptor 2 (three of them `E ... Unable to register cuDNN factory`), which look
like failures and are not. The binaries set `TF_CPP_MIN_LOG_LEVEL=3` before the import;
a library cannot: that level also hides the errors that matter, for the whole process.
So `install` (called when tff_comp is imported, before TensorFlow) sets the level to 1
(C++'s INFO lines off: grappler's and XLA's, printed on TFF's runtime and at compiles;
warnings and errors kept) and makes TensorFlow's first import write fd 2 to a temporary
file, then writes back every line but the known start-up notices (`_NOTICES`). Python's
own warnings and TensorFlow's real errors pass through, in order. Nothing changes when
TensorFlow was imported already, or when `TF_CPP_MIN_LOG_LEVEL` is set (the user
chose). Stdlib only.

Ray's core (2.52, without its dashboard's extras) logs one error from the driver about
30 s after it joins a cluster: it found no metrics agent to export to (ray-project/ray
#59665; no setting stops it). `drop_line` keeps that one line out while it may come.
"""

import atexit
from collections.abc import Iterator, Sequence
import contextlib
import importlib.abc
import importlib.util
import os
import re
import sys
import tempfile
import threading
import time

# What TensorFlow and TFF print at import on a machine without CUDA or TensorRT.
_NOTICES = re.compile(
  r'Unable to register cu(DNN|FFT|BLAS) factory'
  r'|Could not find cuda drivers on your machine'
  r'|cpu_feature_guard\.cc'
  r'|To enable the following instructions: .* rebuild TensorFlow'
  r'|TF-TRT Warning: Could not find TensorRT'
)


# What XLA's host stream executor logs, as an error, when it first compiles on CPU (two
# lines; nothing fails): kept out of the first compiled round (`runtime.inprocess`).
XLA_NOTICES = re.compile(r'SetPriority unimplemented for this stream')


@contextlib.contextmanager
def filtered_stderr(notices: re.Pattern = _NOTICES) -> Iterator[None]:
  """File descriptor 2 (C++ writes there, not to `sys.stderr`) into a temporary file
  while the context runs; then every line not matching `notices` is written back."""
  sys.stderr.flush()
  saved = os.dup(2)
  with tempfile.TemporaryFile('w+b') as captured:
    os.dup2(captured.fileno(), 2)
    try:
      yield
    finally:
      sys.stderr.flush()
      os.dup2(saved, 2)
      os.close(saved)
      captured.seek(0)
      kept = [
        line
        for line in captured.read().decode(errors='replace').splitlines(keepends=True)
        if not notices.search(line)
      ]
      if kept:
        sys.stderr.write(''.join(kept))
        sys.stderr.flush()


class _QuietFirstImport(importlib.abc.MetaPathFinder):
  """Finds `tensorflow` once, with its loader's module run under `filtered_stderr`."""

  def find_spec(self, name: str, path: Sequence[str] | None, target=None):
    del path, target
    if name != 'tensorflow':
      return None
    sys.meta_path.remove(self)  # the real finders find it; this one is done
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None:
      return spec
    run = spec.loader.exec_module

    def exec_module(module) -> None:
      with filtered_stderr():
        run(module)

    spec.loader.exec_module = exec_module  # type: ignore[method-assign]  # this one spec's
    return spec


def install() -> None:
  """TensorFlow's first import in this process, quiet (module docstring), unless it
  happened already or `TF_CPP_MIN_LOG_LEVEL` is set."""
  if 'tensorflow' in sys.modules or 'TF_CPP_MIN_LOG_LEVEL' in os.environ:
    return
  # C++'s INFO lines off, its warnings and errors kept: TFF's runtime otherwise prints
  # two grappler lines for every computation it compiles (44 in a 2-round lasso run)
  # and XLA its start; TensorFlow reads the level once, at its first log line.
  os.environ['TF_CPP_MIN_LOG_LEVEL'] = '1'
  if not any(isinstance(f, _QuietFirstImport) for f in sys.meta_path):
    sys.meta_path.insert(0, _QuietFirstImport())


def drop_line(pattern: re.Pattern, seconds: float) -> None:
  """Keeps the first line matching `pattern` that C++ or Python writes to file
  descriptor 2 in the next `seconds` out; every other line passes at once, in order.

  Descriptor 2 becomes a pipe that a daemon thread copies to the real one, until that
  line came or the time is up; then descriptor 2 is the real one again, unless something
  else took it meanwhile (pytest's capture: the thread then copies for as long as the
  pipe has writers, so no writer ever meets a closed pipe)."""
  sys.stderr.flush()
  real = os.dup(2)
  read, write = os.pipe()
  os.dup2(write, 2)
  os.close(write)
  ours = os.fstat(2).st_ino
  deadline = time.monotonic() + seconds

  def copy() -> None:
    waiting, rest = True, b''
    with open(read, 'rb', buffering=0) as pipe:
      while True:
        chunk = pipe.read(65536)
        if not chunk:  # no writer is left
          break
        waiting = waiting and time.monotonic() <= deadline
        lines = (rest + chunk).split(b'\n')
        rest = lines.pop()
        for line in lines:
          if waiting and pattern.search(line.decode(errors='replace')):
            waiting = False
            continue
          os.write(real, line + b'\n')
        if not waiting and os.fstat(2).st_ino == ours:
          os.dup2(real, 2)  # the pipe's last writer closed: read() returns b'' next
    if rest:
      os.write(real, rest)
    os.close(real)

  thread = threading.Thread(target=copy, name='drop-line', daemon=True)
  thread.start()

  def finish() -> None:
    """At exit, what the pipe holds reaches the real descriptor 2 before the process
    ends (the thread is a daemon)."""
    if os.fstat(2).st_ino == ours:
      sys.stderr.flush()
      os.dup2(real, 2)
      thread.join(timeout=2.0)

  atexit.register(finish)
