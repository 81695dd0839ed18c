"""A share of a cohort's rows of the per-client tables, for the messages of a runtime
that splits cohorts (`runtime.ray`). Each client reads and writes only its own
row of a per-client table (SCAFFOLD's c_i, Ditto's personal models, Local-MOML's
memory, AFL's weights), so a share's messages need only its clients' rows:

    payload: a table T [N, ...] that clients read at their own row (the fields a payload
             type names in `client_rows`) goes as Rows(idx, T[idx], N) for the share's
             clients idx, and arrives as a table of zeros holding those rows;
    sums:    a slot table of the update (`update_aggregation.SLOTS`: every field but `delta`)
             is zero outside the share's rows: it goes as those rows and is added back.

What a share sends and receives grows with its clients, not with the population (as
`tff.federated_select` sends each TFF client its own row).

Client state (the tables a server state's type names in `client_state`: SCAFFOLD's c_i,
Ditto's personal models, Local-MOML's memory; `ops.rule`) does not stay in the state at
all: each share's holder keeps its clients' rows (`ShardRows`), the state holds a `Held`
in each table's place, and a payload's such field goes as `Rows` without values, filled
where the rows are. The server step then runs on the round's rows alone. AFL's weights
on the simplex are projected together: server state, sent as rows above.
"""

from collections.abc import Sequence
import dataclasses
from typing import Any

import numpy as np
import tensorflow as tf

from tff_comp.ops import update_aggregation


@dataclasses.dataclass(frozen=True)
class Rows:
  """Rows `indices` (sorted, distinct) of a table of `total` rows: `values[j]` is row
  `indices[j]`; every other row is zero, or unread where it arrives. A leaf of
  `tf.nest` structures."""

  indices: np.ndarray
  values: np.ndarray | None  # None: the rows of a table the receiver holds
  total: int

  @property
  def nbytes(self) -> int:
    return self.indices.nbytes + (0 if self.values is None else self.values.nbytes) + 8

  def table(self) -> np.ndarray:
    values = self.values
    assert values is not None, 'rows held elsewhere are filled before use (ShardRows.fill)'
    table = np.zeros((self.total, *values.shape[1:]), values.dtype)
    table[self.indices] = values
    return table


def held_fields(server_state: Any) -> tuple[str, ...]:
  """The client state of a server state: the per-client tables its type names in
  `client_state` (`ops.rule`)."""
  return tuple(getattr(type(server_state), 'client_state', ()))


@dataclasses.dataclass(frozen=True)
class Held:
  """A per-client table's place in a state whose rows are held elsewhere (the Ray
  runtime's actors): its shape and dtype, the sum of its entries (what a `counted`
  table logs), the holder (`id` of the runtime) and the version of its rows (the
  holder's count of changes). A leaf of `tf.nest` structures."""

  shape: tuple[int, ...]
  dtype: np.dtype
  total: float
  holder: int
  version: int

  def empty(self) -> np.ndarray:
    """A table of no rows: what the state gives the server rule in its place."""
    return np.zeros((0, *self.shape[1:]), self.dtype)


def is_held(structure: Any) -> bool:
  return any(isinstance(leaf, Held) for leaf in tf.nest.flatten(structure))


class ShardRows:
  """A holder's rows of the per-client tables: {field: its structure of [n, ...] arrays},
  row j being population index `indices[j]`. Pure NumPy."""

  def __init__(self):
    self.indices = np.zeros([0], np.int64)
    self.tables: dict[str, Any] = {}
    self._local: dict[int, int] = {}

  def load(self, shard: tuple[np.ndarray, dict[str, Any]]) -> None:
    """Sets the rows: (population indices, {field: tables of their rows}); copied, as
    what Ray hands over is read-only."""
    indices, tables = shard
    self.indices = np.asarray(indices, np.int64)
    self._local = {int(i): j for j, i in enumerate(self.indices)}
    self.tables = tf.nest.map_structure(np.array, tables)

  def commit(self, change: tuple[np.ndarray, dict[str, Any]]) -> None:
    """Writes rows: (population indices, {field: tables of their new rows})."""
    indices, rows = change
    at = self._at(indices)

    def write(table, new):
      table[at] = new

    tf.nest.map_structure(write, self.tables, rows)

  def take(self, indices: np.ndarray) -> dict[str, Any]:
    """{field: tables of the rows of `indices`} ({} holding none)."""
    if not self.tables:
      return {}
    at = self._at(indices)
    return tf.nest.map_structure(lambda table: table[at], self.tables)

  def fill(self, payload: Any) -> Any:
    """`payload` with each of its `Rows` without values (a held table's) given these
    rows."""

    def own(name, value):
      if name not in self.tables:
        return value
      return tf.nest.map_structure(
        lambda r, table: (
          Rows(r.indices, table[self._at(r.indices)], r.total)
          if isinstance(r, Rows) and r.values is None
          else r
        ),
        value,
        self.tables[name],
      )

    return _map_rows(payload, own)

  def _at(self, indices) -> np.ndarray:
    return np.array([self._local[int(i)] for i in indices], np.int64)


def _rows(table, indices: np.ndarray) -> Rows:
  table = np.asarray(table)
  return Rows(indices, table[indices], table.shape[0])


def _map_rows(structure: Any, fn) -> Any:
  """`structure` with each named tuple's `client_rows` field (at any depth) as
  fn(field name, value)."""
  if hasattr(structure, '_fields'):
    chosen = getattr(type(structure), 'client_rows', ())
    return structure._replace(
      **{
        name: fn(name, value) if name in chosen else _map_rows(value, fn)
        for name, value in zip(structure._fields, structure)
      }
    )
  if isinstance(structure, dict):
    return type(structure)((k, _map_rows(v, fn)) for k, v in structure.items())
  if isinstance(structure, (tuple, list)):
    return type(structure)(_map_rows(v, fn) for v in structure)
  return structure


def select_payload(
  payload: Any, indices: Sequence[int], held: Sequence[str] = (), population: int = 0
) -> Any:
  """`payload` with each per-client table (its types' `client_rows`) as the `Rows` of
  `indices`, the population indices of a share's clients; a table of client state
  (a field in `held`, of `population` rows) as `Rows` without values, filled by the
  share's holder (`ShardRows.fill`)."""
  unique = np.unique(np.asarray(indices, np.int64))

  def rows(name, value):
    if name in held:
      return tf.nest.map_structure(lambda _: Rows(unique, None, population), value)
    return tf.nest.map_structure(lambda t: _rows(t, unique), value)

  return _map_rows(payload, rows)


def expand(structure: Any) -> Any:
  """`structure` with each `Rows` as its whole table (zeros outside its rows)."""
  return tf.nest.map_structure(lambda x: x.table() if isinstance(x, Rows) else x, structure)


def select_sums(
  sums: Any, kind: update_aggregation.UpdateAggregation, indices: Sequence[int]
) -> Any:
  """A share's sums (`stages.RoundSums`) of aggregation `kind` with each slot
  table (`kind.slots`: per-client tables) as the `Rows` of `indices`, its clients'
  population indices."""
  update = sums.update.update
  if not kind.slots or not hasattr(update, 'delta'):
    return sums
  unique = np.unique(np.asarray(indices, np.int64))
  rows = {
    name: tf.nest.map_structure(lambda t: _rows(t, unique), getattr(update, name))
    for name in update_aggregation.slot_fields(update)
  }
  return sums._replace(update=sums.update._replace(update=update._replace(**rows)))
