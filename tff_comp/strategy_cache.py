"""BandMF strategies on disk: `ops.matrix_factorization.optimize(n, b)` takes seconds to
minutes for hundreds of rounds, so each (rounds, bands) is optimized once a machine and
kept under the cache directory (`paths.cache_root()/bandmf`).

A run's privacy rests on the strategy it reads (its columns' unit norms are the
sensitivity the accounting assumes), so a cached one is used only if it is the one
saved (its SHA-256, kept beside it) and still has unit columns; otherwise it is
optimized again, with a line saying why.
"""

import functools
import hashlib
import pathlib
import time
import zipfile

import numpy as np

from tff_comp import paths
from tff_comp.ops import matrix_factorization

# Of the objective and the optimizer: a new one is optimized and cached anew. 2: the
# bands with their checksum (.npz).
VERSION = 2
_UNIT = 1e-9  # how far a column's norm may be from 1 (rounding)


def _digest(band: np.ndarray) -> str:
  return hashlib.sha256(np.ascontiguousarray(band, np.float64).tobytes()).hexdigest()


def column_norms(band: np.ndarray) -> np.ndarray:
  """[n] the norms of C's columns (column s holds band[s + j, j])."""
  n, b = band.shape
  squares = np.zeros(n)
  for j in range(b):
    squares[: n - j] += band[j:, j] ** 2
  return np.sqrt(squares)


def _why_unusable(path: pathlib.Path, rounds: int, bands: int) -> str | None:
  """Why the cached strategy at `path` cannot be used ('' if there is none), None if it
  can."""
  try:
    with np.load(path) as saved:
      band, digest = saved['band'], str(saved['sha256'])
  except FileNotFoundError:
    return ''
  except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile):
    return 'unreadable'
  if band.shape != (rounds, bands):
    return f'shape {band.shape}'
  if _digest(band) != digest:
    return 'not the strategy saved: its checksum differs'
  worst = float(np.max(np.abs(column_norms(band) - 1.0)))
  if not worst <= _UNIT or not np.all(band[:, 0] > 0):
    return f'a column of norm 1 {worst:+.1e}, where the accounting assumes 1'
  return None


@functools.lru_cache(maxsize=8)
def strategy(rounds: int, bands: int) -> matrix_factorization.Strategy:
  """`matrix_factorization.optimize(rounds, bands)`, read from the cache when there and
  verified (module docstring)."""
  path = paths.cache_root() / 'bandmf' / f'prefix-v{VERSION}-n{rounds}-b{bands}.npz'
  why = _why_unusable(path, rounds, bands)
  if why is None:
    with np.load(path) as saved:
      return matrix_factorization.Strategy(saved['band'])
  if why:
    print(f'BandMF: the cached strategy {path} is not used ({why}).', flush=True)
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
    temporary = path.with_name(f'{path.stem}.{id(found)}.tmp.npz')
    np.savez(temporary, band=found.band, sha256=_digest(found.band))
    temporary.replace(path)
  except OSError:  # a cache that cannot be written only costs the optimization again
    pass
  return found
