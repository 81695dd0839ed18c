"""A share of a cohort's rows of the per-client tables, for the messages of a runtime
that splits cohorts (`runtime.ray_runtime`). Each client reads and writes only its own
row of a per-client table (SCAFFOLD's c_i, Ditto's personal models, Local-MOML's
memory, AFL's weights), so a share's messages need only its clients' rows:

    payload: a table T [N, ...] that clients read at their own row (the fields a payload
             type names in `client_rows`) goes as Rows(idx, T[idx], N) for the share's
             clients idx, and arrives as a table of zeros holding those rows;
    sums:    a slot table of the update (`aggregation.SLOTS`: every field but `delta`)
             is zero outside the share's rows: it goes as those rows and is added back.

What a share sends and receives grows with its clients, not with the population (as
`tff.federated_select` sends each TFF client its own row). The whole tables stay in the
runtime's state: the server step reads them (SCAFFOLD's c moves by the sum of the rows'
changes; AFL's weights are projected together) and checkpoints hold them.
"""

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from tff_comp.ops import aggregation


@dataclasses.dataclass(frozen=True)
class Rows:
  """Rows `indices` (sorted, distinct) of a table of `total` rows: `values[j]` is row
  `indices[j]`; every other row is zero, or unread where it arrives. A leaf of
  `tf.nest` structures."""

  indices: np.ndarray
  values: np.ndarray
  total: int

  @property
  def nbytes(self) -> int:
    return self.indices.nbytes + self.values.nbytes + 8

  def table(self) -> np.ndarray:
    table = np.zeros((self.total, *self.values.shape[1:]), self.values.dtype)
    table[self.indices] = self.values
    return table


def _rows(table, indices: np.ndarray) -> Rows:
  table = np.asarray(table)
  return Rows(indices, table[indices], table.shape[0])


def _select(structure: Any, indices: np.ndarray) -> Any:
  """`structure` with the leaves of each named tuple's `client_rows` fields (at any
  depth) as their `Rows` of `indices`."""
  if hasattr(structure, '_fields'):
    chosen = getattr(type(structure), 'client_rows', ())
    return structure._replace(**{
        name: (tf.nest.map_structure(lambda t: _rows(t, indices), value) if name in chosen
               else _select(value, indices))
        for name, value in zip(structure._fields, structure)})
  if isinstance(structure, dict):
    return type(structure)((k, _select(v, indices)) for k, v in structure.items())
  if isinstance(structure, (tuple, list)):
    return type(structure)(_select(v, indices) for v in structure)
  return structure


def select_payload(payload: Any, indices: Sequence[int]) -> Any:
  """`payload` with each per-client table (its types' `client_rows`) as the `Rows` of
  `indices`, the population indices of a share's clients."""
  return _select(payload, np.unique(np.asarray(indices, np.int64)))


def expand(structure: Any) -> Any:
  """`structure` with each `Rows` as its whole table (zeros outside its rows)."""
  return tf.nest.map_structure(lambda x: x.table() if isinstance(x, Rows) else x,
                               structure)


def select_sums(sums: Any, kind: str, indices: Sequence[int]) -> Any:
  """A share's sums (`round_stages.RoundSums`) of aggregation `kind` with each slot
  table (`aggregation.SLOTS`) as the `Rows` of `indices`, its clients' population
  indices."""
  update = sums.update.update
  if kind != aggregation.SLOTS or not hasattr(update, 'delta'):
    return sums
  indices = np.unique(np.asarray(indices, np.int64))
  rows = {name: tf.nest.map_structure(lambda t: _rows(t, indices), getattr(update, name))
          for name in aggregation.slot_fields(update)}
  return sums._replace(update=sums.update._replace(update=update._replace(**rows)))
