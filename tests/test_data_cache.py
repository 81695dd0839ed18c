"""The client-data cache is verified on every use and keyed by the generator's version."""

import importlib
import sys

import numpy as np
import pytest
import tensorflow as tf

from tff_comp.tasks import array_data

IDS = ['a', 'b', 'c']


def _make(i):
  x = np.arange(12, dtype=np.float32).reshape(4, 3) + i
  return x, np.full(4, i, np.float32)


def _load():
  data = array_data.cached_client_data('cache-test', IDS, (3,), tf.int32, _make)
  return {
    cid: [
      np.concatenate([x, [y]])
      for x, y in data.create_tf_dataset_for_client(cid).as_numpy_iterator()
    ]
    for cid in IDS
  }


def _file(tmp_path, cid):
  (directory,) = tmp_path.glob('cache-test-*')
  return directory / f'{cid}.f32'


@pytest.mark.parametrize('damage', ['truncated', 'emptied', 'deleted', 'garbled', 'marker'])
def test_a_damaged_cache_is_generated_again_never_trained_on(tmp_path, monkeypatch, damage):
  monkeypatch.setenv('TFF_COMP_DATA_DIR', str(tmp_path))
  want = _load()
  path = _file(tmp_path, 'b')
  raw = path.read_bytes()
  if damage == 'truncated':
    path.write_bytes(raw[:-12])
  elif damage == 'emptied':
    path.write_bytes(b'')
  elif damage == 'deleted':
    path.unlink()
  elif damage == 'garbled':
    path.write_bytes(raw[:8] + bytes(8) + raw[16:])
  else:
    (path.parent / 'COMPLETE').write_text('not json')
  got = _load()
  assert len(got['b']) == 4
  for cid in IDS:
    np.testing.assert_array_equal(got[cid], want[cid])
  assert path.read_bytes() == raw


def test_a_changed_generator_gets_new_files(tmp_path, monkeypatch):
  module = tmp_path / 'some_generator.py'
  module.write_text('def make(i):\n  return i\n')
  monkeypatch.syspath_prepend(str(tmp_path))
  import some_generator

  before = array_data.generator_version(some_generator.make)
  module.write_text('def make(i):\n  return i + 1\n')
  importlib.reload(some_generator)
  assert array_data.generator_version(some_generator.make) != before
  del sys.modules['some_generator']
