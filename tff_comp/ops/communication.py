"""What a round sends: the bytes each client uploads (its update: the model part as its
aggregator chain encodes it, the other fields as float32) and downloads (the payload,
with a per-client table, SCAFFOLD's c_i or Ditto's personal model, counted as the one row
the client holds), 32 bits a float uncompressed."""

from typing import Any

import tensorflow as tf

from tff_comp.ops import contract


def _floats(structure: Any, population: int | None = None) -> int:
  """Floats in `structure` (specs or tensors); a leaf of `population` rows counts one."""
  total = 0
  for leaf in tf.nest.flatten(structure):
    size = leaf.shape.num_elements()
    if population and leaf.shape.rank and leaf.shape[0] == population and population > 1:
      size //= population
    total += size
  return total


def client_bytes(algorithm: Any, population: int) -> tuple[float, float]:
  """(bytes a client uploads, bytes it downloads) in a round of `algorithm`
  (`ops.algorithm.Algorithm`) on `population` clients."""
  spec = algorithm.server_rule.update_spec()
  part = spec.delta if hasattr(spec, 'delta') else spec
  d, side = _floats(part), _floats(spec) - _floats(part)
  chain = algorithm.model_chain
  model_bits = 32.0 * d if chain is None else chain.upload_bits(d)
  upload = (model_bits + 32.0 * side) / 8.0
  download = 4.0 * _floats(contract.payload_spec(algorithm), population)
  return upload, download
