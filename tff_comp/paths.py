"""Where tff_comp keeps files between runs (imports nothing heavy)."""

import os
import pathlib

CACHE_ENV = 'TFF_COMP_DATA_DIR'


def cache_root() -> pathlib.Path:
  """$TFF_COMP_DATA_DIR, else ~/.cache/tff_comp: generated data, flag manifests."""
  root = os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser('~'), '.cache',
                                                   'tff_comp')
  return pathlib.Path(root)
