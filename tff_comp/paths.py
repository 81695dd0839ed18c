"""Where tff_comp keeps files between runs (imports nothing heavy)."""

import os
import pathlib

CACHE_ENV = 'TFF_COMP_DATA_DIR'


def cache_root() -> pathlib.Path:
  """$TFF_COMP_DATA_DIR, else ~/.cache/tff_comp: generated data, flag manifests."""
  root = os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser('~'), '.cache',
                                                   'tff_comp')
  return pathlib.Path(root)


def check_cache_root() -> None:
  """ValueError unless the cache directory is, or can be made, a writable directory."""
  root = cache_root()
  existing = next((p for p in (root, *root.absolute().parents) if p.exists()), None)
  if existing is not None and not existing.is_dir():
    raise ValueError(f'{CACHE_ENV}={root}: {existing} is a file, not a directory.')
  if existing is not None and not os.access(existing, os.W_OK | os.X_OK):
    raise ValueError(f'{CACHE_ENV}={root}: {existing} is not writable.')
