"""A nested structure's layout, worked out once, for packing many lists of leaves into it.

`tf.nest.pack_sequence_as` checks every container's type on every call, a cost a small
model's round notices for a five-leaf learning state. A round's driver packs
structures every round (its metrics; each trial's state and metrics in a batched group,
`runtime.inprocess.trials`), so `Packer` asks `tf.nest` once where each leaf goes (the
structure packed with the leaves' positions) and rebuilds the containers from that
recipe afterwards, about a tenth of the time for the same state. Containers it does not know (attrs
classes, TFF structures) are packed by `tf.nest` itself.
"""

import collections
from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf

Build = Callable[[Sequence[Any]], Any]


def _recipe(indexed: Any) -> Build | None:
  """How to build the structure whose leaves are the positions in `indexed`, or None
  for a container other than a named tuple, tuple, list or dict."""
  if isinstance(indexed, int):
    position = indexed
    return lambda leaves: leaves[position]
  kind = type(indexed)
  if isinstance(indexed, tuple) and hasattr(indexed, '_fields'):
    named = _recipes(list(indexed))
    return None if named is None else (lambda leaves: kind(*[part(leaves) for part in named]))
  if kind in (tuple, list):
    parts = _recipes(list(indexed))
    return None if parts is None else (lambda leaves: kind([part(leaves) for part in parts]))
  if kind in (dict, collections.OrderedDict):
    keys = list(indexed)
    values = _recipes([indexed[k] for k in keys])
    return (
      None
      if values is None
      else (lambda leaves: kind(zip(keys, [part(leaves) for part in values])))
    )
  return None


def _recipes(children: list[Any]) -> list[Build] | None:
  """The recipes of `children`, or None if any has none."""
  recipes = [_recipe(child) for child in children]
  built = [recipe for recipe in recipes if recipe is not None]
  return built if len(built) == len(recipes) else None


class Packer:
  """Packs lists of leaves into `structure`'s shape, as `tf.nest.pack_sequence_as`
  does (the same containers, the same leaf order), faster (see the module docstring)."""

  def __init__(self, structure: Any):
    self.structure = structure
    self.size = len(tf.nest.flatten(structure))
    indexed = tf.nest.pack_sequence_as(structure, list(range(self.size)))
    build = _recipe(indexed)
    if build is not None:
      # The recipe's containers are `tf.nest`'s own or it is not used.
      try:
        tf.nest.assert_same_structure(build(list(range(self.size))), structure, check_types=True)
      except (TypeError, ValueError):
        build = None
    self._build = build

  def pack(self, leaves: Sequence[Any]) -> Any:
    if len(leaves) != self.size:
      raise ValueError(f'{len(leaves)} leaves for a structure of {self.size}.')
    if self._build is None:
      return tf.nest.pack_sequence_as(self.structure, leaves)
    return self._build(leaves)
