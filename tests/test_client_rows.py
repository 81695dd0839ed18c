"""A share's rows of the per-client tables (`runtime.client_rows`), without Ray: what a
holder keeps of client state (`ShardRows`) and the payload rows it fills, against the
whole tables indexed in NumPy."""

import numpy as np
import pytest
import tensorflow as tf

from tff_comp.ops import maml, messages, scaffold
from tff_comp.runtime import client_rows

POPULATION = 6
SHARD = np.array([1, 3, 5])  # the holder's clients' population indices


def _tables(seed: int) -> dict:
  rng = np.random.default_rng(seed)
  return {
    'memory': (rng.normal(size=(POPULATION, 2, 3)).astype(np.float32),),
    'seen': rng.integers(0, 2, POPULATION).astype(np.float32),
  }


def _holder(tables: dict) -> client_rows.ShardRows:
  rows = client_rows.ShardRows()
  rows.load(
    (
      SHARD,
      {
        name: (value[0][SHARD],) if name == 'memory' else value[SHARD]
        for name, value in tables.items()
      },
    )
  )
  return rows


def test_client_state_is_what_a_server_state_type_names():
  assert client_rows.held_fields(maml.MemoryState((), (), ())) == ('memory', 'seen')
  assert client_rows.held_fields(scaffold.ControlState((), (), ())) == ('controls',)
  assert client_rows.held_fields(messages.MemoryPayload((), (), ())) == ()


def test_a_holder_commits_takes_and_fills_the_rows_of_its_clients():
  """Rows committed for some clients replace theirs alone; a payload's held tables,
  sent as rows without values, arrive as the whole tables' rows of the share's clients
  (zeros elsewhere); the payload's other fields pass untouched."""
  tables, new = _tables(0), _tables(1)
  holder = _holder(tables)
  changed = np.array([5, 1])
  holder.commit((changed, {'memory': (new['memory'][0][changed],), 'seen': new['seen'][changed]}))
  want = {
    name: (np.copy(value[0]),) if name == 'memory' else np.copy(value)
    for name, value in tables.items()
  }
  want['memory'][0][changed] = new['memory'][0][changed]
  want['seen'][changed] = new['seen'][changed]

  taken = holder.take(np.array([3, 5]))
  np.testing.assert_array_equal(taken['memory'][0], want['memory'][0][[3, 5]])
  np.testing.assert_array_equal(taken['seen'], want['seen'][[3, 5]])

  weights = np.arange(4.0)
  payload = client_rows.select_payload(
    messages.MemoryPayload(weights, tables['memory'], tables['seen']),
    [5, 3, 5],
    held=('memory', 'seen'),
    population=POPULATION,
  )
  assert payload.memory[0].values is None and payload.seen.values is None
  filled = client_rows.expand(holder.fill(payload))
  share = [3, 5]
  for got, whole in ((filled.memory[0], want['memory'][0]), (filled.seen, want['seen'])):
    expected = np.zeros_like(whole)
    expected[share] = whole[share]
    np.testing.assert_array_equal(got, expected)
  assert filled.weights is weights


def test_a_holder_restores_from_its_snapshot_and_the_rows_sent_since():
  """What a restarted Ray actor is given (`ray_actors.Shard.restore`): its rows as a
  snapshot saw them (a copy: Ray serializes it), then the rows sent since."""
  tables, new = _tables(2), _tables(3)
  holder = _holder(tables)
  snapshot = (holder.indices.copy(), tf.nest.map_structure(np.copy, holder.tables))
  change = (np.array([3]), {'memory': (new['memory'][0][[3]],), 'seen': new['seen'][[3]]})
  holder.commit(change)
  again = client_rows.ShardRows()
  again.load(snapshot)
  again.commit(change)
  for name in ('memory', 'seen'):
    np.testing.assert_array_equal(
      np.asarray(again.take(SHARD)[name]), np.asarray(holder.take(SHARD)[name])
    )
  np.testing.assert_array_equal(again.take(np.array([3]))['memory'][0], new['memory'][0][[3]])
  with pytest.raises(KeyError):  # a client of another holder
    holder.take(np.array([2]))
