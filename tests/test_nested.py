"""`runtime.nested.Packer` packs as `tf.nest.pack_sequence_as` does: the same containers,
the same leaves in the same places, for every kind of container a run's states and
metrics hold, and for the ones it leaves to `tf.nest`."""

import collections
from typing import NamedTuple

import attr
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tests import algorithm_cases
from tff_comp.runtime import inprocess, nested


class Pair(NamedTuple):
  first: object
  second: object


@attr.s(frozen=True)
class Record:
  value = attr.ib()


def _same(packed, want):
  tf.nest.assert_same_structure(packed, want, check_types=True)
  assert list(tf.nest.flatten(packed)) == list(tf.nest.flatten(want))
  assert repr(packed) == repr(want)  # dict keys in the same order too


STRUCTURES = {
  'leaf': 1.0,
  'named tuples, empty tuples': Pair(Pair(1, ()), (2, 3)),
  # tf.nest orders a dict's leaves by sorted key, whatever the insertion order.
  'dicts out of key order': collections.OrderedDict(
    b=1, a=Pair(2, [3, {'z': 4, 'y': 5}]), c=collections.OrderedDict()
  ),
  'plain dict': {'loss': 1, 'accuracy': (2, 3)},
  'attrs record (tf.nest packs it)': Pair(Record(1), 2),
}


@pytest.mark.parametrize('name', list(STRUCTURES))
def test_packs_as_tf_nest(name):
  structure = STRUCTURES[name]
  packer = nested.Packer(structure)
  leaves = [f'leaf {i}' for i in range(packer.size)]
  _same(packer.pack(leaves), tf.nest.pack_sequence_as(structure, leaves))


def test_a_runs_state_packs_without_tf_nest(monkeypatch):
  """A learning state (TFF's named tuples, hparams in an OrderedDict) is packed by the
  recipe, not by tf.nest, and equals tf.nest's packing."""
  algorithm = algorithm_cases.algorithm('scaffold', {})
  state = inprocess.build(algorithm, algorithm_cases.DATA['unequal'], engine='mapped').initialize()
  assert isinstance(state, tff.learning.templates.LearningAlgorithmState)
  packer = nested.Packer(state)
  leaves = [np.full([2], i) for i in range(packer.size)]
  want = tf.nest.pack_sequence_as(state, leaves)
  monkeypatch.setattr(tf.nest, 'pack_sequence_as', None)  # not called
  packed = packer.pack(leaves)
  tf.nest.assert_same_structure(packed, want, check_types=True)
  for a, b in zip(tf.nest.flatten(packed), tf.nest.flatten(want), strict=True):
    assert a is b


def test_a_wrong_number_of_leaves_is_refused():
  with pytest.raises(ValueError, match='3 leaves for a structure of 2'):
    nested.Packer(Pair(1, 2)).pack([1, 2, 3])
