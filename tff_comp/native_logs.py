"""TensorFlow's C++ start-up lines kept out of a user's session, real errors kept.

Importing TensorFlow 2.14 on a machine without CUDA prints about nine lines from C++ on
file descriptor 2 (three of them `E ... Unable to register cuDNN factory`), which look
like failures and are not. The binaries set `TF_CPP_MIN_LOG_LEVEL=3` before the import;
a library cannot: that level also hides the errors that matter, for the whole process.
So `install` (called when tff_comp is imported, before TensorFlow) makes TensorFlow's
first import write fd 2 to a temporary file, then writes back every line but the known
start-up notices (`_NOTICES`). Python's own warnings and TensorFlow's real errors pass
through, in order. Nothing changes when TensorFlow was imported already, or when
`TF_CPP_MIN_LOG_LEVEL` is set (the user chose). Stdlib only.
"""

from collections.abc import Iterator, Sequence
import contextlib
import importlib.abc
import importlib.util
import os
import re
import sys
import tempfile

# What TensorFlow and TFF print at import on a machine without CUDA or TensorRT.
_NOTICES = re.compile(
  r'Unable to register cu(DNN|FFT|BLAS) factory'
  r'|Could not find cuda drivers on your machine'
  r'|cpu_feature_guard\.cc'
  r'|To enable the following instructions: .* rebuild TensorFlow'
  r'|TF-TRT Warning: Could not find TensorRT'
)


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

    spec.loader.exec_module = exec_module
    return spec


def install() -> None:
  """TensorFlow's first import in this process, quiet (module docstring), unless it
  happened already or `TF_CPP_MIN_LOG_LEVEL` is set."""
  if 'tensorflow' in sys.modules or 'TF_CPP_MIN_LOG_LEVEL' in os.environ:
    return
  if not any(isinstance(f, _QuietFirstImport) for f in sys.meta_path):
    sys.meta_path.insert(0, _QuietFirstImport())
