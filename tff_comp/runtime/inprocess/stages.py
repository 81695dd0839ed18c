"""The in-process round in stages, shared by a run's round (`inprocess.InProcessRuntime`)
and a batched group of trials' (`inprocess_trials.TrialGroup`, which runs `finish` once per
trial on that trial's clients):

    client_plans    the cohort's batch plans and round context (the reference and start
                    losses of rules that use them)
    (an engine runs the clients' work: `runtime.inprocess.engines`)
    finish          the aggregation (the model part by the algorithm's aggregator chain,
                    `ops.aggregators`, its draws seeded by the run, the round and each
                    client), the server step and the round's metrics, packed
    unpack_metrics  those metrics on the host, in their structure
"""

import collections
from collections.abc import Sequence
import functools
from typing import Any, NamedTuple

import numpy as np
import tensorflow as tf

from tff_comp.ops import aggregators, client_round, local_loop, update_aggregation
from tff_comp.ops import algorithm as algorithm_lib
from tff_comp.ops import rule as rule_lib
from tff_comp.runtime import client_rows, nested, traced
from tff_comp.runtime.inprocess import lanes as lanes_lib


class RoundSums(NamedTuple):
  """A cohort's (or a share's) clients summed for the round's end: the aggregation's
  `update_aggregation.Sums`, the aggregator chain's (`ops.aggregators.Sums`; () without a
  chain) and the clients' stats."""

  update: update_aggregation.Sums
  model: Any
  stats: Any


def add_sums(shares: Sequence[Any]) -> Any:
  """The sum of the shares' `RoundSums` (NumPy), in the order given; a chain needing
  every row (a median) gets the shares' rows concatenated instead."""
  first = shares[0].model
  if not (isinstance(first, aggregators.Sums) and not isinstance(first.values, tuple)):
    return tf.nest.map_structure(lambda *parts: functools.reduce(np.add, parts), *shares)
  rows = {
    name: np.concatenate([getattr(share.model, name) for share in shares])
    for name in aggregators.ROW_FIELDS
    if not isinstance(getattr(first, name), tuple)
  }
  apart = [
    share._replace(model=share.model._replace(**dict.fromkeys(rows, ()))) for share in shares
  ]
  total = tf.nest.map_structure(lambda *parts: functools.reduce(np.add, parts), *apart)
  return total._replace(model=total.model._replace(**rows))


class RoundStages:
  """The stages of `algorithm`'s round on `data` (`resident_data.ResidentData` or streamed)."""

  def __init__(self, algorithm: algorithm_lib.Algorithm, data: Any):
    self.algorithm, self.data = algorithm, data
    self._chain = algorithm.model_chain  # an ops.aggregators.Chain, or None: the mean
    # A chain's encodes as one XLA program where a stage's many ops a row would each
    # cost their dispatch (`Stage.worth_compiling`: the Hadamard rotation with 8-bit
    # quantization took 2.5x lasso's plain round as graph ops, 1.4x compiled). Not where
    # every encode is a few ops, cheaper than the program's launch (clipping: 0.03 ms
    # more a round as graph ops, 0.14 ms compiled; top-k with error feedback 0.09 ms
    # against 0.14: docs/speed.md, part 9); not for a stage reading the whole cohort
    # (an attack's), whose rows cannot be padded to a compiled size (`_encode`), nor one
    # whose draws XLA would change (`Stage.exact_under_xla`: an attack's, so that it
    # picks the attackers it picks on every runtime).
    # The chain is bound, not an argument: a tf.function keys its traces by its Python
    # arguments, which would need a plugin's stages hashable.
    self._compiled_encode = None
    chain = self._chain
    if (
      chain is not None
      and any(stage.worth_compiling for stage in chain.stages)
      and not chain.cohort_wide
      and chain.exact_under_xla
    ):
      bound: aggregators.Chain = chain

      def encode_rows(*cohort) -> aggregators.Encoded:
        return _encode_rows(bound, *cohort)

      self._compiled_encode = tf.function(encode_rows, jit_compile=True, autograph=False)
    # The round's metrics' structure (`pack_metrics`) and each leaf's (start, end, shape,
    # dtype) in the packed vector, noted when traced, so that unpacking a round's
    # metrics is a slice per leaf and one `nested.Packer` call.
    self._metric_packer: nested.Packer | None = None
    self._metric_layout: list[tuple[int, int, tuple[int, ...], Any]] = []

  @property
  def encodes_compiled(self) -> bool:
    """Whether the chain's encodes run as one XLA program (`__init__` says when)."""
    return self._compiled_encode is not None

  def reference_candidates(
    self, payload, hparams, positions: tf.Tensor, *, trial: tf.Tensor | None = None
  ) -> tf.Tensor:
    """Each client's candidate for the round's reference loss ([m]; rules with
    `uses_reference_loss`)."""
    rule = self.algorithm.client_rule

    def received(position):  # (payload, hparams) of the client at `position`
      return lanes_lib.received(payload, hparams, trial, position)

    return self.data.map_clients(
      lambda p, _, examples: rule.reference_value(received(p)[0], examples, received(p)[1]),
      positions,
    )

  def client_plans(
    self,
    payload,
    hparams,
    positions: tf.Tensor,
    indices: tf.Tensor,
    work: tf.Tensor,
    round_num,
    seed,
    *,
    trial: tf.Tensor | None = None,
    trials: int = 1,
    reference=None,
  ) -> tuple[client_round.ClientPlan, Any]:
    """The cohort's `ClientPlan`s and the round's reference loss (None unless the rule
    uses one: the largest of the clients' candidates; `reference` when given, the
    whole cohort's where its clients run in several places). With `trial` ([m],
    batched trials: `runtime.inprocess.trials`), `payload`, `hparams`, `round_num` and
    `seed` are per trial, each client reads its trial's, and the reference is per trial
    ([trials])."""
    rule, options = self.algorithm.client_rule, self.algorithm.client_options

    def received(position):  # (payload, hparams) of the client at `position`
      return lanes_lib.received(payload, hparams, trial, position)

    def per_client(value):  # a per-trial value, for each client
      return value if trial is None else tf.gather(value, trial)

    if rule.uses_reference_loss and reference is None:
      candidates = self.reference_candidates(payload, hparams, positions, trial=trial)
      reference = (
        tf.reduce_max(candidates)
        if trial is None
        else tf.math.unsorted_segment_max(candidates, trial, trials)
      )
    if not rule.uses_reference_loss:
      reference = None
    m = tf.shape(indices)[:1]
    context = rule_lib.RoundContext(
      indices,
      tf.zeros(m)
      if reference is None
      else tf.broadcast_to(tf.cast(per_client(reference), tf.float32), m),
      tf.zeros(m),
    )
    if rule.uses_start_loss:
      context = context._replace(
        start_loss=self.data.map_clients(
          lambda p, _, examples: rule.start_loss(received(p)[0], examples, received(p)[1]),
          positions,
        )
      )
    counts = tf.gather(self.data.counts, positions)
    batches = local_loop.limit(
      client_round.plan_cohort(
        rule,
        options,
        counts,
        tf.gather(self.data.keys, positions),
        per_client(round_num),
        seed=per_client(seed),
      ),
      work,
    )
    return client_round.ClientPlan(context, batches), reference

  def finish(
    self,
    outputs: client_round.ClientOutput,
    weights,
    server_state,
    aggregator,
    round_num,
    seed,
    reference,
    indices,
    capacity: int | None = None,
  ):
    """The round after its clients' work: aggregation (the aggregator chain's draws
    seeded by `seed`, the round and the clients' population `indices`), the server step
    and the round's metrics, packed (`pack_metrics`). Returns (weights, server state,
    aggregator state, metrics). `capacity`: the most clients a round of this program
    has (None: not known)."""
    if self._chain is None:
      total = self._sums(outputs, ())
    else:
      encoded = self._encode(self._chain, outputs, aggregator, indices, round_num, seed, capacity)
      if self._chain.row_size:  # each client's persistent rows, written back
        aggregator = aggregator._replace(
          rows=tf.tensor_scatter_nd_update(
            aggregator.rows, tf.cast(indices, tf.int32)[:, None], encoded.rows
          )
        )
      total = self._sums(outputs, self._chain.sums(aggregator.chain, encoded))
    return self.finish_sums(total, weights, server_state, aggregator, round_num, seed, reference)

  def sums(
    self, outputs: client_round.ClientOutput, aggregator, indices, round_num, seed
  ) -> RoundSums:
    """What the clients `outputs` (stacked; population `indices`) contribute to the
    round's end, as sums: a share of the cohort's (one Ray actor's) adds to the others'
    (`add_sums`). Their persistent rows (error feedback's) are not written back here:
    runtimes summing shares apart refuse chains with rows."""
    if self._chain is None:
      return self._sums(outputs, ())
    encoded = self._encode(self._chain, outputs, aggregator, indices, round_num, seed)
    return self._sums(outputs, self._chain.sums(aggregator.chain, encoded))

  def _sums(self, outputs: client_round.ClientOutput, model: Any) -> RoundSums:
    return RoundSums(
      self.algorithm.aggregation.sums(outputs.update, outputs.weight),
      model,
      tf.nest.map_structure(lambda s: tf.reduce_sum(s, axis=0), outputs.stats),
    )

  def _encode(
    self,
    chain: aggregators.Chain,
    outputs: client_round.ClientOutput,
    aggregator,
    indices,
    round_num,
    seed,
    capacity: int | None = None,
  ) -> aggregators.Encoded:
    """The clients' model parts, flattened to rows, through the `chain`'s encodes."""
    cohort = (self.algorithm.aggregation.model_part(outputs.update), outputs.weight, indices)
    if self._compiled_encode is None:
      return _encode_rows(chain, aggregator, *cohort, round_num, seed)
    # Rows padded to the round's capacity, or else to a power of two, so that XLA
    # compiles a program for one size or a few, not for every cohort size sampling,
    # dropout or deadlines leave (220 ms each on lasso's); a row's encoding reads no
    # other row, so the padding's are cut after.
    m = tf.shape(indices)[0]
    if capacity is None:
      powers = tf.constant([2**k for k in range(31)])
      size = tf.reduce_min(tf.where(powers >= m, powers, powers[-1]))
    else:
      size = tf.constant(capacity)
    padded = tf.nest.map_structure(
      lambda t: tf.pad(t, [[0, size - m]] + [[0, 0]] * (t.shape.rank - 1)), cohort
    )
    encoded = self._compiled_encode(aggregator, *padded, round_num, seed)
    return tf.nest.map_structure(lambda t: t[:m], encoded)

  def finish_sums(
    self, total: 'RoundSums', weights, server_state, aggregator, round_num, seed, reference
  ):
    """`finish` from the whole cohort's `sums`."""
    algorithm = self.algorithm
    kind = algorithm.aggregation
    measured: collections.OrderedDict[str, Any] = collections.OrderedDict()
    if self._chain is None:
      update = kind.from_sums(total.update)
    else:
      vector, chain_state, chained = self._chain.finish(
        aggregator.chain, total.model, aggregators.round_seed(seed, round_num)
      )
      aggregator = aggregator._replace(chain=chain_state)
      summed = total.update.update
      one_row = summed.delta if hasattr(summed, 'delta') else summed
      # Nested as TFF's factories report them (under 'mean' beside side channels).
      measured.update(
        collections.OrderedDict(mean=chained) if hasattr(summed, 'delta') else chained
      )
      update = kind.from_sums(total.update, aggregators.unflatten(vector, one_row))
    server_state, weights = algorithm.server_rule.step(server_state, weights, update)
    measured.update(kind.measurements(total.update))
    metrics = collections.OrderedDict(
      distributor=(),
      client_work=client_round.train_metrics(total.stats, reference),
      aggregator=measured or (),
      finalizer=(),
    )
    return weights, server_state, aggregator, self.pack_metrics(metrics)

  def pack_metrics(self, metrics) -> tf.Tensor:
    """A round's metrics as one float64 vector, so they reach the host in one transfer
    (a GPU would wait once, not once per metric); `unpack_metrics` restores them. Notes
    their structure, when traced."""
    specs = tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape, t.dtype), metrics)
    self._metric_packer = nested.Packer(specs)
    self._metric_layout, start = [], 0
    for spec in tf.nest.flatten(specs):
      if not spec.shape.is_fully_defined():
        raise ValueError(f'a round metric has the unknown shape {spec.shape}.')
      size = spec.shape.num_elements()
      self._metric_layout.append(
        (start, start + size, tuple(spec.shape), spec.dtype.as_numpy_dtype)
      )
      start += size
    leaves = [tf.reshape(tf.cast(t, tf.float64), [-1]) for t in tf.nest.flatten(metrics)]
    return tf.concat(leaves, 0) if leaves else tf.zeros([0], tf.float64)

  def unpack_metrics(self, packed: tf.Tensor):
    """`pack_metrics`'s metrics (of one trial) as NumPy values, in their structure and
    dtypes."""
    values = np.asarray(packed)
    leaves = [
      values[start:end].reshape(shape).astype(dtype)
      for start, end, shape, dtype in self._metric_layout
    ]
    if self._metric_packer is None:
      raise RuntimeError("a round's metrics are unpacked after it was traced.")
    return self._metric_packer.pack(leaves)


class HostFinish:
  """The server side of a round whose clients ran elsewhere (Ray's actors, buffered
  async's cohorts of earlier versions) and reach the host in NumPy, as their stacked
  outputs or as the cohort's sums: the payload they start from, and
  `RoundStages.finish` or `finish_sums`, each traced once for cohorts of every size and
  run on `device`. With `rows`, the per-client tables of the server state and the
  update's slots hold the round's clients' rows alone (`client_rows`: client state
  held elsewhere), as many as the round has."""

  def __init__(self, stages: RoundStages, device: str):
    algorithm = stages.algorithm
    self._seed, self._device = algorithm.client_options.seed, device
    self._payload = tf.function(
      lambda state: algorithm.server_rule.payload(state.finalizer, state.global_model_weights),
      autograph=False,
    )

    def finish(outputs, weights, server_state, aggregator, round_num, seed, reference, indices):
      # Eight arguments, which its concrete function binds (not `capacity`): cohorts of
      # every size arrive here, their encodes' rows padded to powers of two.
      return stages.finish(
        outputs, weights, server_state, aggregator, round_num, seed, reference, indices
      )

    self._finish = {
      name: traced.OnceTraced(fn)
      for name, fn in (
        ('outputs', finish),
        ('sums', stages.finish_sums),
        ('rows', stages.finish_sums),
      )
    }

  def payload(self, state) -> Any:
    """The payload clients receive from `state` (in tensors), in NumPy."""
    return tf.nest.map_structure(np.asarray, self._payload(state))

  def __call__(
    self,
    outputs: client_round.ClientOutput,
    state,
    aggregator,
    reference: float | None,
    indices: Sequence[int],
  ):
    """`RoundStages.finish` of the cohort's `outputs` (stacked NumPy; its clients'
    population `indices`) from `state` (in tensors) with the aggregator state
    `aggregator`: (weights, server state, aggregator state, packed metrics)."""
    return self._run(
      'outputs', outputs, state, aggregator, reference, tf.constant(indices, tf.int32)
    )

  def from_sums(
    self, total: RoundSums, state, aggregator, reference: float | None, *, rows: bool = False
  ):
    """As `__call__`, from the whole cohort's sums (`RoundStages.finish_sums`); `rows`:
    the tables and slots of the round's rows alone (see the class docstring)."""
    return self._run('rows' if rows else 'sums', total, state, aggregator, reference)

  def _run(self, kind: str, clients, state, aggregator, reference, *indices):
    args = (
      state.global_model_weights,
      state.finalizer,
      aggregator,
      state.client_work.round,
      self._seed,
      None if reference is None else tf.constant(reference, tf.float32),
      *indices,
    )
    finish = self._finish[kind]
    if not finish.traced(kind):  # one trace for cohorts of every size
      specs = tf.nest.map_structure(
        lambda o: tf.TensorSpec([None, *o.shape[1:]] if kind == 'outputs' else o.shape, o.dtype),
        clients,
      )
      traced_args = args
      if kind == 'rows':
        specs, server = _any_rows(specs), state.finalizer
        traced_args = (
          args[0],
          server._replace(
            **{name: _any_rows(getattr(server, name)) for name in client_rows.held_fields(server)}
          ),
          *args[2:],
        )
      if indices:
        traced_args = (*traced_args[:-1], tf.TensorSpec([None], tf.int32))
      finish.trace(kind, specs, *traced_args)
    with tf.device(self._device):
      return finish(kind, clients, *args)


def _any_rows(structure: Any) -> Any:
  """TensorSpecs of `structure`'s per-client parts with any number of rows: a server
  state's tables, or the update slots of `RoundSums` (others keep their shapes)."""

  def free(leaf):
    return tf.TensorSpec([None, *leaf.shape[1:]], leaf.dtype)

  if isinstance(structure, RoundSums):
    update = structure.update.update
    slots = {
      name: tf.nest.map_structure(free, getattr(update, name))
      for name in update_aggregation.slot_fields(update)
    }
    return structure._replace(update=structure.update._replace(update=update._replace(**slots)))
  return tf.nest.map_structure(free, structure)


def add_shares(
  shares: Sequence[RoundSums], found: Sequence[dict[str, Any]]
) -> tuple[RoundSums, dict]:
  """A cohort split in shares (Ray's actors), from their answers in share order: the
  round's sums (the shares' added; their slots' rows, `client_rows.Rows`, concatenated
  instead) and the tables of client state as the round found them, the same rows in the
  same order."""
  update = shares[0].update.update
  slots = update_aggregation.slot_fields(update)

  def rows_of(parts):
    return tf.nest.map_structure(
      lambda *rs: np.concatenate([r.values if isinstance(r, client_rows.Rows) else r for r in rs]),
      *parts,
    )

  without = [
    s._replace(
      update=s.update._replace(update=s.update.update._replace(**dict.fromkeys(slots, ())))
    )
    for s in shares
  ]
  total = add_sums(without)
  total = total._replace(
    update=total.update._replace(
      update=total.update.update._replace(
        **{name: rows_of([getattr(s.update.update, name) for s in shares]) for name in slots}
      )
    )
  )
  return total, {name: rows_of([f[name] for f in found]) for name in found[0]}


def _encode_rows(
  chain: aggregators.Chain, aggregator, part, weights, indices, round_num, seed
) -> aggregators.Encoded:
  """`chain`'s encodes of a cohort's model parts `part` (stacked; the clients'
  `weights`, population `indices`), flattened to rows, with each client's persistent
  rows and seed."""
  x = aggregators.flatten(part)
  rows = tf.gather(aggregator.rows, indices) if chain.row_size else tf.zeros([tf.shape(x)[0], 0])
  seeds = aggregators.client_seeds(seed, round_num, indices)
  return chain.encode(aggregator.chain, x, weights, rows, seeds)
