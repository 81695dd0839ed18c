"""A binary's stdout when its reader leaves early (`run.py | head -1`,
`compare.py ... | head -3`): output stops, the program completes, exit status 0. Light (no
TensorFlow), for every binary that prints."""

from collections.abc import Callable
import os
import sys


class PipeSafeStdout:
  """stdout that, once its reader has gone (`run.py | head -1`), sends the rest of the
  output to /dev/null instead of raising BrokenPipeError, so the run goes on."""

  def __init__(self, stream):
    self._stream = stream

  def _to_devnull(self) -> None:
    # Python's documented recipe: the stream's fd now points at /dev/null, so what is
    # still buffered and everything after it (also the flush at exit) goes there.
    os.dup2(os.open(os.devnull, os.O_WRONLY), self._stream.fileno())

  def write(self, text: str) -> int:
    try:
      return self._stream.write(text)
    except BrokenPipeError:
      self._to_devnull()
      return len(text)

  def flush(self) -> None:
    try:
      self._stream.flush()
    except BrokenPipeError:
      self._to_devnull()

  def __getattr__(self, name):
    return getattr(self._stream, name)


def closing_stdout_quietly(main: Callable[[list[str]], None]) -> Callable[[list[str]], None]:
  """`main`, where a reader closing stdout early (`run.py | head -1`) is not an error:
  output stops, the run completes and writes its files, exit status 0."""

  def wrapped(argv: list[str]) -> None:
    if not isinstance(sys.stdout, PipeSafeStdout):
      sys.stdout = PipeSafeStdout(sys.stdout)
    main(argv)
    sys.stdout.flush()

  return wrapped
