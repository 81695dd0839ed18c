"""The resident data's buffer on 2 MB pages (`runtime.inprocess.huge_pages`)."""

import os
import pathlib
import sys

import numpy as np
import pytest
import tensorflow as tf

from tff_comp.runtime.inprocess import huge_pages, resident_data


def _huge_kb(address: int) -> int:
  """AnonHugePages (kB) of this process's mapping holding `address` (smaps)."""
  holds = False
  with open('/proc/self/smaps') as smaps:
    for line in smaps:
      first = line.split()[0]
      if '-' in first and ':' not in first:  # a mapping's header: start-end ...
        low, high = (int(x, 16) for x in first.split('-'))
        holds = low <= address < high
      elif holds and line.startswith('AnonHugePages:'):
        return int(line.split()[1])
  return 0


def _kernel_gives_huge_pages() -> bool:
  """Whether this kernel backs an advised range with huge pages at once: Linux 6.1's
  MADV_COLLAPSE, transparent huge pages not off (told by the system, not by the code
  under test, so that a broken `advise` fails here rather than skips)."""
  enabled = pathlib.Path('/sys/kernel/mm/transparent_hugepage/enabled')
  if not sys.platform.startswith('linux') or not enabled.exists():
    return False
  release = tuple(int(x) for x in os.uname().release.split('-')[0].split('.')[:2])
  return release >= (6, 1) and '[never]' not in enabled.read_text()


def test_a_resident_buffer_advised_is_backed_by_huge_pages():
  data = resident_data.ResidentData(
    (np.random.default_rng(0).random((4096, 1024), np.float32),),
    np.full(32, 128),
    tuple(str(i) for i in range(32)),
    'CPU:0',
    with_keys=False,
  )
  if not _kernel_gives_huge_pages():
    pytest.skip('this kernel gives no transparent huge pages at once (MADV_COLLAPSE)')
  assert data.huge_pages
  view = np.asarray(data.examples[0].value())
  page = 2 << 20
  assert _huge_kb(-(-view.ctypes.data // page) * page) >= 2048
  # The data themselves are unchanged.
  np.testing.assert_array_equal(view, np.random.default_rng(0).random((4096, 1024), np.float32))


def test_buffers_under_one_huge_page_are_left_alone():
  small = tf.Variable(np.zeros(1000, np.float32), trainable=False)
  assert not huge_pages.advise((small,))
  np.testing.assert_array_equal(small.numpy(), 0)
