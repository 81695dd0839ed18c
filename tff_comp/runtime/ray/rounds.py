"""The driver of a run on Ray (`RayRuntime`; `runtime.ray` builds and registers
it): it holds the state, sends each round's cohort to the actors holding its clients,
adds their sums and ends the round; see `runtime.ray`'s docstring."""

from collections.abc import Sequence
import copy
import time
from typing import Any, NamedTuple

from absl import logging
import numpy as np
import tensorflow as tf

from tff_comp.ops import client_round
from tff_comp.runtime import base, client_rows, inprocess, learning_state
from tff_comp.runtime.inprocess import stages
from tff_comp.runtime.ray import actors as ray_actors
from tff_comp.runtime.ray import cluster as ray_cluster

# Rows of client state sent to an actor since its last snapshot, kept by the driver to
# restore a restarted actor: at most this many bytes an actor, then a new snapshot.
# Changes below Ray's inline size (its max_direct_call_object_size) go as they are and
# stay in the driver's memory (Ray keeps such objects with their owner anyway, and a
# `ray.put` of one costs more than the round's message); larger ones go to Ray's
# object store.
JOURNAL_BYTES = 4 * 2**20
_INLINE_BYTES = 100 * 2**10
# How long the driver waits while Ray says an actor is restarting (a new process that
# imports TensorFlow: about 10 s on an idle machine, measured over 2 minutes at load 7
# on 2 cores), and after how long it says so in one line.
RESTART_WAIT = 900.0
RESTART_NOTICE = 30.0


class RoundCosts(NamedTuple):
  """What a round on Ray cost: bytes sent to the actors (the payload with the actor's
  clients' rows of the per-client tables, hparams and the private aggregator's state, to
  each; their new rows of client state) and received (each actor's sums, the size of one
  update whatever its number of clients, and those clients' rows; their rows of client
  state as found), seconds from sending to the last answer, and seconds of the driver's
  round end (aggregation, noise, server step, metrics)."""

  sent: int
  received: int
  clients_seconds: float
  driver_seconds: float


def _nbytes(structure) -> int:
  return sum(
    leaf.nbytes if isinstance(leaf, client_rows.Rows) else np.asarray(leaf).nbytes
    for leaf in tf.nest.flatten(structure)
  )


class RayRuntime:
  """Runs an algorithm with its clients on Ray actors (see the module docstring; `build`
  makes one): `driver` is the in-process runtime of the algorithm on `client_data` that
  holds the state, chooses the engine and runs each round's end; `shipped`, the
  algorithm pickled before the driver traced it. Implements `base.Runtime`."""

  name = 'ray'
  partial_work = True
  sampler = None

  def __init__(
    self,
    driver: inprocess.InProcessRuntime,
    shipped: bytes,
    client_data,
    options: ray_cluster.RayOptions,
    data_memory_budget: float,
  ):
    self._driver, self._options = driver, options
    ray = ray_cluster.connect(options.ray_address)
    self._ray = ray
    self.keeps_personal_models = driver.keeps_personal_models
    ids = list(client_data.client_ids)
    count = min(options.ray_actors, len(ids))
    self._owner = {cid: i % count for i, cid in enumerate(ids)}  # client -> actor
    # Client state (`client_rows.held_fields`): actor k holds the rows of its clients'
    # population indices `_shards[k]`; `_journal[k]` restores them (a reference to the
    # last snapshot, then the rows sent since: `_journal_size[k]` rows and bytes);
    # `_version` counts the changes; `_undo` (the version before the last round, each
    # actor's rows as the round found them) rebuilds that version's tables.
    self._shards = [
      np.array([driver.population_index[c] for c in ids[k::count]], np.int64) for k in range(count)
    ]
    self._journal: list[list[Any]] = [[] for _ in range(count)]
    self._journal_size = [(0, 0)] * count
    self._version = 0
    self._undo: tuple[int, dict[int, tuple[np.ndarray, Any]]] | None = None
    ray_cluster.check_gpus(ray, options.ray_address, count, options.ray_gpus_per_actor)
    self._actors = ray_actors.actor_pool(ray, count, options.ray_gpus_per_actor)
    # Each actor on its share (streamed where it exceeds the budget, as in-process),
    # with the engine the whole run takes: a client's numbers depend on the engine.
    self._setups = [
      (
        shipped,
        ray_actors.sub_data(client_data, ids[k::count]),
        driver.engine,
        data_memory_budget,
        driver.capacity,
      )
      for k in range(count)
    ]
    self._data = (
      'arrays' if isinstance(self._setups[0][1], ray_actors.Examples) else 'dataset function'
    )
    if self._data == 'arrays':
      logging.info(
        "ray runtime: the task's ClientData does not pickle; each actor"
        " receives its clients' examples as arrays (once, at setup)"
      )
    self._pool = ray_actors.pool_key(ray, count, options.ray_gpus_per_actor)
    self._set_up_all()
    ray_actors.SERVING[self._pool] = id(self)
    self._host = stages.HostFinish(driver.stages, driver.device)
    self.costs: RoundCosts | None = None  # the last round's
    logging.info('ray runtime: %s', self.description)

  @property
  def description(self) -> str:
    return (
      f'ray ({self._options.ray_address}), {len(self._actors)} actors, each'
      f' {self._driver.description}'
    )

  @property
  def record(self) -> dict[str, Any]:
    return dict(
      self._driver.record,
      name=self.name,
      address=self._options.ray_address,
      actors=len(self._actors),
      shipped_data=self._data,
    )

  def actor_pids(self) -> list[int]:
    """The actors' processes (as they run now)."""
    return self._ray.get([a.pid.remote() for a in self._actors])

  # --- state: the driver's -----------------------------------------------------------

  def initialize(self) -> base.State:
    return self._driver.initialize()

  def starting_chain_at(self, chain_state: Any) -> 'RayRuntime':
    started = copy.copy(self)  # its actors shared
    started._driver = self._driver.starting_chain_at(chain_state)
    return started

  def get_model_weights(self, state: base.State):
    return self._driver.get_model_weights(state)

  def set_model_weights(self, state: base.State, weights) -> base.State:
    return self._driver.set_model_weights(self.whole_state(state), weights)

  def get_hparams(self, state: base.State):
    return self._driver.get_hparams(state)

  def set_hparams(self, state: base.State, hparams) -> base.State:
    return self._driver.set_hparams(state, hparams)

  def get_personal_weights(self, state: base.State):
    return self._driver.get_personal_weights(self.whole_state(state))

  def whole_state(self, state: base.State) -> base.State:
    """`state` with its client state's tables whole, gathered from the actors (what a
    checkpoint saves); a state of the last round or the one before it (an interrupted
    round's save: `_undo`).

    Raises:
      ValueError: the state's tables are another run's, or older.
    """
    tables = self._tables(state)
    if not client_rows.is_held(tables):
      return state
    version = self._check_held(tables, (self._version, self._undo and self._undo[0]))
    self._take_actors()
    whole = tf.nest.map_structure(lambda held: np.zeros(held.shape, held.dtype), tables)
    shards = self._call('snapshot', None, dict.fromkeys(range(len(self._actors)), ())).values()
    undone = self._undo[1].values() if self._undo and version != self._version else ()
    for indices, rows in (*shards, *undone):
      tf.nest.map_structure(
        lambda table, part, at=indices: table.__setitem__(at, part), whole, rows
      )
    return _with_tables(state, whole)

  def prefetch(self, client_ids: Sequence[str]) -> None:
    del client_ids  # each actor reads its own clients when their round comes

  def reserve_cohort(self, size: int) -> None:
    """Each actor's lanes kernel holds `size` clients (a share of a cohort never has
    more), compiled once."""
    self._setups = [(*setup[:4], max(setup[4], size)) for setup in self._setups]
    self._take_actors()
    self._call('reserve_cohort', None, dict.fromkeys(range(len(self._actors)), (size,)))

  # --- rounds --------------------------------------------------------------------------

  def next(
    self, state: base.State, client_ids: Sequence[str], work: Sequence[float] | None = None
  ) -> base.RoundOutput:
    """One round on `client_ids` (as `InProcessRuntime.next`), their work on the
    actors holding them."""
    if not client_ids:
      raise ValueError('a round needs at least one client.')
    self._take_actors()
    work = [1.0] * len(client_ids) if work is None else list(work)
    held = client_rows.held_fields(state.finalizer)
    if held:
      state = self._hold(state)
      tables = self._tables(state)
      state = _with_tables(
        state,
        tf.nest.map_structure(  # the server rule sees no rows
          lambda table: table.empty(), tables
        ),
      )
    state = learning_state.as_tensors(state)
    round_num = int(state.client_work.round)
    payload = self._host.payload(state)
    hparams = tf.nest.map_structure(np.asarray, state.client_work.hparams)
    parts: dict[int, list[int]] = {}  # actor -> positions in the cohort
    for position, cid in enumerate(client_ids):
      parts.setdefault(self._owner[cid], []).append(position)
    index = self._driver.population_index
    rows = {k: [index[client_ids[p]] for p in ps] for k, ps in parts.items()}
    # Each actor's payload holds its clients' rows of the per-client tables alone.
    payloads = {k: client_rows.select_payload(payload, rows[k], held, len(index)) for k in parts}
    rule = self._driver.algorithm.client_rule
    reference = None
    if rule.uses_reference_loss:
      reference = float(
        max(
          np.max(c)
          for c in self._call(
            'reference_candidates',
            round_num,
            {k: (payloads[k], hparams, [client_ids[p] for p in ps]) for k, ps in parts.items()},
          ).values()
        )
      )
    start = time.perf_counter()
    private = tf.nest.map_structure(np.asarray, state.aggregator)  # the clip in force
    results = self._call(
      'client_sums',
      round_num,
      {
        k: (
          payloads[k],
          hparams,
          [client_ids[p] for p in ps],
          [work[p] for p in ps],
          rows[k],
          round_num,
          reference,
          private,
        )
        for k, ps in parts.items()
      },
    )
    gathered = time.perf_counter()
    shares = [share for share, _ in results.values()]  # in actor order
    committed = 0
    if held:
      total, found = stages.add_shares(shares, [old for _, old in results.values()])
      weights, server, aggregator, metrics = self._host.from_sums(
        total,
        state._replace(finalizer=state.finalizer._replace(**found)),
        state.aggregator,
        reference,
        rows=True,
      )
      server, committed = self._commit(
        server,
        tables,
        found,
        {  # in actor order
          k: np.unique(np.asarray(rows[k], np.int64)) for k in results
        },
      )
    else:
      total = stages.add_sums([client_rows.expand(share) for share in shares])
      weights, server, aggregator, metrics = self._host.from_sums(
        total, state, state.aggregator, reference
      )
    work_state = client_round.ClientWorkState(
      state.client_work.hparams, state.client_work.round + 1
    )
    output = base.RoundOutput(
      learning_state.assemble(weights, work_state, server, aggregator),
      self._driver.stages.unpack_metrics(metrics),
    )
    self.costs = RoundCosts(
      sum(_nbytes((p, hparams, private)) for p in payloads.values()) + committed,
      sum(_nbytes(result) for result in results.values()),
      gathered - start,
      time.perf_counter() - gathered,
    )
    return output

  # --- client state: held by the actors ----------------------------------------------

  @staticmethod
  def _tables(state: base.State) -> dict[str, Any]:
    """{field: table} of the state's client state."""
    server = state.finalizer
    return {name: getattr(server, name) for name in client_rows.held_fields(server)}

  def _check_held(self, tables: dict[str, Any], versions: Sequence[int | None]) -> int:
    """The version of held `tables`, one of `versions` of this runtime's.

    Raises:
      ValueError: a table is not held, or another run's, or of another version.
    """
    leaves = tf.nest.flatten(tables)
    version = leaves[0].version if isinstance(leaves[0], client_rows.Held) else None
    if (
      version is None
      or version not in versions
      or any(
        not isinstance(leaf, client_rows.Held) or leaf.holder != id(self) or leaf.version != version
        for leaf in leaves
      )
    ):
      raise ValueError(
        "this state's per-client tables are held by another Ray run, or are of an"
        ' earlier round than its actors hold; continue from the latest state (or from'
        ' `whole_state` of an earlier one, taken at its round).'
      )
    return version

  def _hold(self, state: base.State) -> base.State:
    """`state` with its client state held by the actors: whole tables (the initial
    state, a restored checkpoint) are sent to them; held ones are checked to be the
    latest."""
    tables = self._tables(state)
    if client_rows.is_held(tables):
      self._check_held(tables, (self._version,))
      return state
    if not self._driver.algorithm.aggregation.slots:
      raise base.UnsupportedError(
        'client state on Ray needs an aggregation with per-client slots'
        ' (ops.update_aggregation.SLOTS), which carry its rows'
      )
    whole = tf.nest.map_structure(np.asarray, tables)
    for k in range(len(self._actors)):
      self._journal[k] = [
        self._ray.put(
          (
            self._shards[k],
            tf.nest.map_structure(lambda table, at=self._shards[k]: table[at], whole),
          )
        )
      ]
      self._journal_size[k] = (0, 0)
    self._call('restore', None, {k: tuple(journal) for k, journal in enumerate(self._journal)})
    self._version, self._undo = self._version + 1, None
    return _with_tables(
      state,
      tf.nest.map_structure(
        lambda table: client_rows.Held(
          table.shape, table.dtype, float(table.sum(dtype=np.float64)), id(self), self._version
        ),
        whole,
      ),
    )

  def _commit(
    self, server, tables: dict[str, Any], found: dict[str, Any], indices: dict[int, np.ndarray]
  ) -> tuple[Any, int]:
    """Sends each actor its clients' new rows of client state (the server step's
    `server` tables, the round's rows in actor order, as `found` was), notes them in
    its journal (a snapshot instead, once the rows since the last reach its shard's or
    `JOURNAL_BYTES`), and returns (`server` with the tables held, the bytes sent)."""
    new = {name: tf.nest.map_structure(np.asarray, getattr(server, name)) for name in tables}
    undo, start, sent = {}, 0, 0
    for k, at in indices.items():
      part = slice(start, start + len(at))
      start += len(at)
      change = (at, tf.nest.map_structure(lambda rows, p=part: rows[p], new))
      undo[k] = (at, tf.nest.map_structure(lambda rows, p=part: rows[p], found))
      size = _nbytes(change)
      if size >= _INLINE_BYTES:
        change = self._ray.put(change)
      self._actors[k].commit.remote(change)
      sent += size
      self._journal[k].append(change)
      rows, kept = self._journal_size[k]
      self._journal_size[k] = (rows + len(at), kept + size)
      if rows + len(at) >= len(self._shards[k]) or kept + size >= JOURNAL_BYTES:
        self._journal[k], self._journal_size[k] = [self._actors[k].snapshot.remote()], (0, 0)
    self._undo, self._version = (self._version, undo), self._version + 1
    held = tf.nest.map_structure(
      lambda h, now, was: client_rows.Held(
        h.shape,
        h.dtype,
        h.total + float(now.sum(dtype=np.float64) - was.sum(dtype=np.float64)),
        id(self),
        self._version,
      ),
      tables,
      new,
      found,
    )
    return server._replace(**held), sent

  def _call(self, method: str, round_num: int | None, args: dict[int, tuple]) -> dict[int, Any]:
    """{actor: actors[actor].method(*args[actor])}, run together; an actor that died is
    restarted by Ray, set up again with its rows of client state, and its call made
    again (up to `ray_cluster.RETRIES` times), said in one line (naming the round, if in one)."""
    ray = self._ray
    pending = {k: getattr(self._actors[k], method).remote(*a) for k, a in args.items()}
    results, attempts = {}, dict.fromkeys(args, 0)
    while pending:
      k, ref = next(iter(pending.items()))
      try:
        results[k] = ray.get(ref)
        del pending[k]
      except ray.exceptions.RayActorError:
        attempts[k] += 1
        if attempts[k] > ray_cluster.RETRIES:
          raise
        print(
          f'ray: actor {k} died in round {round_num + 1}; its clients run again on'
          ' its restarted actor.'
          if round_num is not None
          else f'ray: actor {k} died; it is restarted with its rows of client state.',
          flush=True,
        )
        self._set_up_again(k)
        pending[k] = getattr(self._actors[k], method).remote(*args[k])
    return dict(sorted(results.items()))

  def _take_actors(self) -> None:
    """The pool's actors set up for this runtime again (its algorithm, shards and rows
    of client state), if another runtime of this process took them since."""
    if ray_actors.SERVING.get(self._pool) == id(self):
      return
    logging.info('ray runtime: the actors served another run; setting them up for this one again')
    for k in range(len(self._actors)):
      self._set_up_again(k)
    ray_actors.SERVING[self._pool] = id(self)

  def _set_up_all(self) -> None:
    """Every actor set up on its shard, together; one that Ray is still restarting
    (an earlier run on this pool killed it) is waited for as `_set_up_again` does."""
    ray = self._ray
    refs = [a.setup.remote(*setup) for a, setup in zip(self._actors, self._setups)]
    for k, ref in enumerate(refs):
      try:
        ray.get(ref)
      except ray.exceptions.ActorUnavailableError:
        self._set_up_again(k)

  def _set_up_again(self, k: int) -> None:
    """Actor `k` set up on its shard again, with its rows of client state (after Ray
    restarted it, waiting while Ray says it is restarting, up to `RESTART_WAIT` s and
    said once past `RESTART_NOTICE` s; or after another run took it)."""
    ray, start, said = self._ray, time.monotonic(), False
    while True:
      try:
        ray.get(self._actors[k].setup.remote(*self._setups[k]))
        if self._journal[k]:  # its rows of client state
          ray.get(self._actors[k].restore.remote(*self._journal[k]))
        return
      except ray.exceptions.ActorUnavailableError:
        waited = time.monotonic() - start
        if waited > RESTART_WAIT:
          raise
        if waited > RESTART_NOTICE and not said:
          print(
            f'ray: actor {k} is still restarting after {waited:.0f} s (a busy machine?);'
            f' waiting up to {RESTART_WAIT / 60:.0f} min.',
            flush=True,
          )
          said = True
        time.sleep(0.2)


def _with_tables(state, tables: dict[str, Any]):
  """`state` with the fields `tables` of its server state replaced."""
  return state._replace(finalizer=state.finalizer._replace(**tables))
