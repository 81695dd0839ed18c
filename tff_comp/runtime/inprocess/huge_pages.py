"""Resident client data on 2 MB pages, where Linux allows it.

A round reads its clients' rows in the order of their shuffled batches, cold from
memory: a row of lasso's (d = 1,024) is one 4 KB page, so each row read also missed
the TLB. Backed by 2 MB pages, the population's 32 MB take 16 TLB entries. Measured on
the project's 2-core machines (two runtimes on the same data in one process, their
rounds alternating in blocks of 60): lasso's round 0.902 -> 0.860 and 0.856 -> 0.820
ms.

TensorFlow allocates a variable's buffer itself (it copies a NumPy array, even one
NumPy placed on huge pages), so the buffer is advised after the fact:
`madvise(MADV_HUGEPAGE)` lets the kernel back the range with 2 MB pages, and
`MADV_COLLAPSE` (Linux 6.1) does so at once. Python's `mmap.madvise` takes only its own
mappings, hence libc's through ctypes: the process's own symbols (`CDLL(None)`, which
holds libc's), not `ctypes.util.find_library('c')`, which runs `ldconfig -p` in a
subprocess each call (4 ms from a process holding TensorFlow; 441 calls in the suite).
"""

from collections.abc import Callable
import ctypes
import sys

import numpy as np
import tensorflow as tf

_PAGE = 2 << 20
_MADV_HUGEPAGE = 14
_MADV_COLLAPSE = 25


def _madvise() -> Callable[[int, int, int], int] | None:
  if not sys.platform.startswith('linux'):
    return None
  try:
    madvise = ctypes.CDLL(None, use_errno=True).madvise
  except (OSError, AttributeError):
    return None
  madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
  madvise.restype = ctypes.c_int
  return madvise


def advise(variables) -> bool:
  """Backs the whole 2 MB pages inside each CPU variable of `variables` (a structure)
  with huge pages. True if some buffer spans such a page and every such buffer now is
  backed; False if none does (small data, another device) or the kernel refuses (no
  transparent huge pages, a kernel before Linux 6.1, not Linux). The variables must
  not be assigned afterwards (an assignment may move the buffer)."""
  madvise, advised, done = _madvise(), False, True
  for variable in tf.nest.flatten(variables):
    if 'CPU' not in variable.device.upper() or variable.dtype == tf.string:
      continue  # not in this process's memory, or not one buffer of the data
    # The variable's own buffer (a CPU tensor's NumPy view shares its memory).
    view = np.asarray(variable.value())
    start = -(-view.ctypes.data // _PAGE) * _PAGE
    end = (view.ctypes.data + view.nbytes) // _PAGE * _PAGE
    if end <= start:
      continue  # under one huge page
    advised = True
    done = (
      madvise is not None
      and madvise(start, end - start, _MADV_HUGEPAGE) == 0
      and madvise(start, end - start, _MADV_COLLAPSE) == 0
    ) and done
  return advised and done
