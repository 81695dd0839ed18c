"""BandMF strategies on disk: `ops.matrix_factorization.optimize(n, b)` takes seconds to
minutes for hundreds of rounds, so each (rounds, bands) is optimized once a machine and
kept under the cache directory (`paths.cache_root()/bandmf`)."""

import functools
import time

import numpy as np

from tff_comp import paths
from tff_comp.ops import matrix_factorization

# Of the objective and the optimizer: a new one is optimized and cached anew.
VERSION = 1


@functools.lru_cache(maxsize=8)
def strategy(rounds: int, bands: int) -> matrix_factorization.Strategy:
  """`matrix_factorization.optimize(rounds, bands)`, read from the cache when there."""
  path = paths.cache_root() / 'bandmf' / f'prefix-v{VERSION}-n{rounds}-b{bands}.npy'
  try:
    band = np.load(path)
    if band.shape == (rounds, bands) and np.all(band[:, 0] > 0):
      return matrix_factorization.Strategy(band)
  except (OSError, ValueError, EOFError):  # absent or unreadable: optimized (again)
    pass
  # The one slow step of a BandMF run's start (minutes for long runs): said, then timed.
  print(
    f'BandMF: optimizing the noise strategy for {rounds} rounds and {bands} bands (once on'
    f' this machine; kept in {path.parent})...',
    flush=True,
  )
  start = time.perf_counter()
  found = matrix_factorization.optimize(rounds, bands)
  print(f'BandMF: strategy optimized in {time.perf_counter() - start:.1f} s.', flush=True)
  try:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f'{path.stem}.{id(found)}.tmp.npy')
    np.save(temporary, found.band)
    temporary.replace(path)
  except OSError:  # a cache that cannot be written only costs the optimization again
    pass
  return found
