"""Where tff_comp keeps files between runs, and which data files a task read (imports
nothing heavy)."""

from collections.abc import Iterator
import contextlib
import hashlib
import os
import pathlib
from typing import Any

CACHE_ENV = 'TFF_COMP_DATA_DIR'


def cache_root() -> pathlib.Path:
  """$TFF_COMP_DATA_DIR, else ~/.cache/tff_comp: generated data, flag manifests."""
  root = os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser('~'), '.cache', 'tff_comp')
  return pathlib.Path(root)


def check_cache_root() -> None:
  """ValueError unless the cache directory is, or can be made, a writable directory."""
  root = cache_root()
  existing = next((p for p in (root, *root.absolute().parents) if p.exists()), None)
  if existing is not None and not existing.is_dir():
    raise ValueError(f'{CACHE_ENV}={root}: {existing} is a file, not a directory.')
  if existing is not None and not os.access(existing, os.W_OK | os.X_OK):
    raise ValueError(f'{CACHE_ENV}={root}: {existing} is not writable.')


# The data files read while `recording_data_files` is active, each by its path.
_RECORDERS: list[dict[str, dict[str, Any]]] = []
_MIB = 2**20


def fingerprint(path: pathlib.Path) -> dict[str, Any]:
  """A data file's size and the SHA-256 of its first and last MiB: enough to tell
  another version of a multi-GB file apart without reading it whole."""
  size = path.stat().st_size
  digest = hashlib.sha256()
  with open(path, 'rb') as f:
    digest.update(f.read(_MIB))
    if size > 2 * _MIB:
      f.seek(size - _MIB)
    digest.update(f.read(_MIB))
  return {'bytes': size, 'sha256_head_tail': digest.hexdigest()}


def note_data_file(path: pathlib.Path) -> None:
  """Records `path` as read (its `fingerprint`) in every active recording."""
  if _RECORDERS:
    record = fingerprint(path)
    for files in _RECORDERS:
      files[str(path)] = record


@contextlib.contextmanager
def recording_data_files() -> Iterator[dict[str, dict[str, Any]]]:
  """{path: fingerprint} of the data files noted while the context runs (a task's
  build: config.json's `environment.data_files`)."""
  files: dict[str, dict[str, Any]] = {}
  _RECORDERS.append(files)
  try:
    yield files
  finally:
    _RECORDERS.remove(files)
