"""What a round sends: the bytes each client uploads (its update: the model part as its
aggregator chain encodes it, the other fields as float32) and downloads (the payload),
32 bits a float uncompressed.

A per-client table [N, ...] counts the one row a client holds, in both directions: the
payload fields a payload type names in `client_rows` (SCAFFOLD's c_i, Ditto's personal
model, AFL's weight), and an update's slots under `update_aggregation.SLOTS` (every field but
`delta`: a client fills its own row). Tables are known by these declarations, never by
their shape: a model weight whose first dimension equals the number of clients is a
weight."""

from collections.abc import Collection
from typing import Any

import tensorflow as tf

from tff_comp.ops import contract, update_aggregation


def _floats(structure: Any) -> int:
  """Floats in `structure` (specs or tensors)."""
  return sum(leaf.shape.num_elements() for leaf in tf.nest.flatten(structure))


def _row_floats(structure: Any) -> int:
  """Floats in one row of each [N, ...] table of `structure`."""
  return sum(leaf.shape[1:].num_elements() for leaf in tf.nest.flatten(structure))


def _message_floats(message: Any, tables: Collection[str]) -> int:
  """Floats a client sends or receives of `message`: the fields named in `tables` one
  row each, the others whole."""
  if not hasattr(message, '_fields'):
    return _floats(message)
  return sum(
    _row_floats(getattr(message, name)) if name in tables else _floats(getattr(message, name))
    for name in message._fields
  )


def client_bytes(algorithm: Any) -> tuple[float, float]:
  """(bytes a client uploads, bytes it downloads) in a round of `algorithm`
  (`ops.algorithm.Algorithm`)."""
  spec = algorithm.server_rule.update_spec()
  part = spec.delta if hasattr(spec, 'delta') else spec
  slots = (
    update_aggregation.slot_fields(spec)
    if algorithm.aggregation is update_aggregation.SLOTS
    else ()
  )
  d, side = _floats(part), _message_floats(spec, slots) - _floats(part)
  chain = algorithm.model_chain
  model_bits = 32.0 * d if chain is None else chain.upload_bits(d)
  upload = (model_bits + 32.0 * side) / 8.0
  payload = contract.payload_spec(algorithm)
  download = 4.0 * _message_floats(payload, getattr(type(payload), 'client_rows', ()))
  return upload, download


def compressed(algorithm: Any) -> bool:
  """Whether `algorithm`'s aggregator chain sends its model part in fewer bits than 32
  a float."""
  chain = algorithm.model_chain
  if chain is None:
    return False
  spec = algorithm.server_rule.update_spec()
  d = _floats(spec.delta if hasattr(spec, 'delta') else spec)
  return chain.upload_bits(d) < 32.0 * d
