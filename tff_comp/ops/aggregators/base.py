"""The aggregator contract: how a round's client updates become the server's one.

An aggregator is a chain of stages ending in a combiner (`Chain`), as optax chains its
transforms. It acts on the model part of the clients' updates (the model delta; FedNova's
normalized delta), each client's flattened to one row x_i of a cohort matrix X [m, d]:

    client i:  x_i -> stage_1.encode -> ... -> stage_k.encode -> y_i   (in the round)
    server:    {y_i} -> pre_aggregation    (optional: rows mixed, a robust combiner's)
               y = combiner({y_i}, {w_i})    (decomposable: from sums shares add)
               y -> stage_k.decode -> ... -> stage_1.decode -> the model update

`Stage.encode` maps the cohort's rows row by row (a row never reads another's: a client's
encoding is its own, whatever cohort or Ray actor it is in), with the clients' weights,
their persistent rows (error feedback's residual, `rows`), a seed per client (stochastic
rounding) and the stage's state; it returns the encoded rows and weights, the new
persistent rows, and per-client counts (clipped or not) that the server sums. A stage's
`decode` maps the combined vector at the server, sees the counts' sums and updates the
stage's state (an adaptive clip norm). A combiner is `decomposable` (a mean, a secure
sum, a majority vote: from sums that shares of a cohort add, as Ray's actors and FedBuff's
buffer do) or needs every row (a median, a trimmed mean, Krum, a geometric median).

The side channels of an update (FedNova's ||a_i||, trackers, per-client slots) never
pass through an aggregator: `ops.update_aggregation` keeps their exact aggregation.
"""

import collections
import dataclasses
from typing import Any, NamedTuple

import tensorflow as tf

State = Any
Measurements = collections.OrderedDict
# The per-client count an attack stage marks its forged rows with (1: forged).
ATTACKERS = 'attackers'
# What a selection rule's combine measures beside its scalars: [m] each row's share of
# the rows it chose (Krum: 1 for the chosen row). The chain takes it out of the
# measurements and reports `attackers_selected` from it (`Chain.finish`).
ROWS_SELECTED = 'rows_selected'


class Encoded(NamedTuple):
  """A cohort's (or a share's) rows after the stages' encodes.

  values: [m, d] encoded rows. weights: [m] their weights. rows: the clients' new
  persistent rows, [m, row_size] (row_size 0: none). counts: {name: [m]} per-client
  numbers the stages' decodes see summed (in `Chain.sums`' `counts`).
  """

  values: tf.Tensor
  weights: tf.Tensor
  rows: tf.Tensor
  counts: dict[str, tf.Tensor]


class Context(NamedTuple):
  """What a stage's decode knows of the round: the cohort's number of clients, its total
  weight, and the factor the combiner scaled the sum of the rows by (1 / total weight,
  1 / n; None for a combiner that is not a scaled sum)."""

  clients: tf.Tensor
  weight: tf.Tensor
  scale: tf.Tensor | None


class Stage:
  """One step of a chain: a per-client encode and a server-side decode (identities by
  default), each with the stage's state. Subclasses document their math."""

  name = 'stage'
  row_size = 0  # floats of persistent state each client keeps (error feedback: d)
  randomized = False  # draws random numbers (per client, or per round at the server)
  cohort_wide = False  # a row's encoding reads other rows of the cohort (ALIE's attack)
  # Its draws follow a client across rounds (by its index in the population: a fixed
  # set of attackers), which TFF's anonymous clients cannot give.
  by_client = False
  # A compressor C with E||C(x) - x||^2 <= (1 - delta) ||x||^2, delta > 0, for every x:
  # what error feedback (EF, EF21) needs to keep its residuals bounded.
  contractive = False
  # Its rows are scaled signs, which a plain mean combines as signSGD's majority vote
  # (Bernstein et al. 2019; `combiners.MajorityVote`).
  votes = False
  # Its encode gives the same bits compiled by XLA as run by TensorFlow: its draws are
  # `ops.stateless`'s hashes. TensorFlow's stateless random ops draw other bits under
  # XLA, so a stage using them in its encode says False, and its chain's encodes are
  # not compiled (`runtime.inprocess.stages`).
  exact_under_xla = True
  # Its encode is many ops a row (draws, transforms), faster as one XLA program than op
  # by op; a few-op encode (clipping, top-k) is faster as graph ops (`inprocess.stages`).
  worth_compiling = False
  # Its settings that its state holds, not its program (`Chain.structure`).
  in_state: tuple[str, ...] = ()

  def for_error_feedback(self) -> 'Stage':
    """This compressor as error feedback wraps it (rand-k unscaled: contractive)."""
    return self

  def bind(self, d: int) -> 'Stage':
    """This stage for rows of `d` floats (a stage needing d, for its persistent rows or a
    rotation's padding, returns a copy knowing it)."""
    del d
    return self

  def initial_state(self) -> State:
    return ()

  def encode(
    self, state: State, x: tf.Tensor, weights: tf.Tensor, rows: tf.Tensor, seeds: tf.Tensor
  ) -> Encoded:
    """The cohort's rows `x` [m, d] encoded; `rows` [m, row_size] its clients' persistent
    rows; `seeds` [m, 2] a stateless seed per client."""
    del state, seeds
    return Encoded(x, weights, rows, {})

  def decode(
    self,
    state: State,
    y: tf.Tensor,
    counts: dict[str, tf.Tensor],
    context: Context,
    seed: tf.Tensor,
  ) -> tuple[tf.Tensor, State, Measurements]:
    """(the combined vector `y` [d] decoded, the stage's new state, measurements);
    `counts` the sums of its encode's counts; `seed` [2] the round's."""
    del counts, context, seed
    return y, state, Measurements()

  def upload_bits(self, d: int, bits: float) -> float:
    """Bits a client sends for a row of `d` floats that arrive here as `bits` bits
    (a compressor's fewer; 32 d uncompressed)."""
    del d
    return bits

  def output_size(self, d: int) -> int:
    """The length of its encoded rows, for rows of `d` floats (a rotation pads)."""
    return d

  def why_not(self, chain: 'Chain') -> str:
    """Why this stage cannot work in `chain` ('' when it can): a Gaussian mechanism
    noises a sum, which a median is not."""
    del chain
    return ''


class Combiner:
  """How the encoded rows become one vector [d]. A `decomposable` combiner is computed
  from `sums` of shares of the cohort, added (`from_sums`); another needs every row
  (`combine`). Unweighted combiners (the robust ones) count every client alike."""

  name = 'combiner'
  decomposable = True
  weighted = True  # uses the clients' weights (False: every client alike)
  scaled_sum = False  # its result is the rows' sum times a scale (a mean, a secure sum)
  # A selection rule (Krum, Bulyan): its result is read from rows it chooses, which its
  # combine measures (`ROWS_SELECTED`), so that a chain can say how many attack.
  selects = False
  in_state: tuple[str, ...] = ()  # as `Stage.in_state`

  def min_rows(self) -> tuple[int, str]:
    """(the fewest rows a round for the rule to do what it says, why): a median of two
    rows is their mean, Krum needs 2f + 3. A smaller round (dropouts, Poisson sampling)
    still combines; the settings refuse a cohort that is always smaller."""
    return 1, ''

  def upload_bits(self, d: int, bits: float) -> float:
    """Bits a client sends of a row of `d` values that arrive as `bits` (a secure sum's
    modulus)."""
    del d
    return bits

  def bind(self, d: int) -> 'Combiner':
    """This combiner for rows of `d` floats (one with a state of d floats returns a copy
    knowing it)."""
    del d
    return self

  def initial_state(self) -> State:
    return ()

  def sums(self, state: State, values: tf.Tensor, weights: tf.Tensor) -> Any:
    """A share's contribution, added elementwise across shares (decomposable only)."""
    raise NotImplementedError

  def from_sums(
    self, state: State, total: Any
  ) -> tuple[tf.Tensor, tf.Tensor | None, State, Measurements]:
    """(the combined vector, the scale it applied to the rows' sum or None, the new
    state, measurements) from the cohort's added `sums`."""
    raise NotImplementedError

  def combine(
    self, state: State, values: tf.Tensor, weights: tf.Tensor
  ) -> tuple[tf.Tensor, tf.Tensor | None, State, Measurements]:
    """As `from_sums`, from every row. A selection rule (Krum) also measures
    `ROWS_SELECTED`."""
    return self.from_sums(state, self.sums(state, values, weights))


class PreAggregation:
  """Rows mixed at the server before a combiner of every row reads them (a robust one):
  bucketing (Karimireddy, He and Jaggi 2022), nearest-neighbour mixing (Allouah et al.
  2023). Stateless; its settings are its program's (`Chain.structure`)."""

  name = 'pre_aggregation'
  in_state: tuple[str, ...] = ()  # none: it has no state

  def rows(self, m: int) -> int:
    """The rows m' that `mix` makes of a cohort's m."""
    return m

  def min_rows(self) -> tuple[int, str]:
    """As `Combiner.min_rows`, of the cohort it mixes."""
    return 1, ''

  def mix(
    self, values: tf.Tensor, weights: tf.Tensor, seed: tf.Tensor
  ) -> tuple[tf.Tensor, tf.Tensor]:
    """([m', d] rows, [m'] weights) from the cohort's encoded [m, d] rows and [m]
    weights; `seed` [2] the round's own stream for it."""
    raise NotImplementedError

  def mix_marks(self, values: tf.Tensor, marks: tf.Tensor, seed: tf.Tensor) -> tf.Tensor | None:
    """[m'] the share of each mixed row's members that attack, from the rows' [m]
    `marks` (1: forged), as `mix` mixes them; None: it cannot say."""
    del values, marks, seed
    return None


class ChainState(NamedTuple):
  """A chain's state: each stage's, then the combiner's."""

  stages: tuple[Any, ...]
  combiner: Any


class Sums(NamedTuple):
  """What a share of a cohort contributes to the round's aggregate: the combiner's sums
  (a decomposable combiner) or the encoded rows themselves (`values`, `weights`: [m, d],
  [m]; empty otherwise), and the stages' counts summed, the clients and their weights;
  `marks` [m], the rows an attack stage forged (1), beside rows a selection rule reads
  (empty otherwise). Shares add leaf by leaf, but the fields of rows (`ROW_FIELDS`),
  which they concatenate."""

  combined: Any
  values: Any
  weights: Any
  counts: dict[str, tf.Tensor]
  clients: tf.Tensor
  weight: tf.Tensor
  marks: Any = ()


ROW_FIELDS = ('values', 'weights', 'marks')  # a `Sums`' fields that hold a row per client


@dataclasses.dataclass(frozen=True)
class Chain:
  """Stages then a combiner (see the module docstring); every runtime's aggregator of the
  model part. `Chain((), Mean())` is the weighted mean, what an algorithm aggregates
  by without an aggregator."""

  stages: tuple[Stage, ...]
  combiner: Combiner
  pre_aggregation: PreAggregation | None = None

  def __post_init__(self):
    object.__setattr__(self, 'stages', tuple(self.stages))
    for stage in self.stages:
      if not isinstance(stage, Stage):
        raise TypeError(f"a chain's stages are Stages, got {type(stage).__name__}.")
    if not isinstance(self.combiner, Combiner):
      raise TypeError(f'a chain ends in a Combiner, got {type(self.combiner).__name__}.')
    if self.pre_aggregation is not None:
      if not isinstance(self.pre_aggregation, PreAggregation):
        raise TypeError(
          f'pre_aggregation is a PreAggregation, got {type(self.pre_aggregation).__name__}.'
        )
      if self.combiner.decomposable:
        raise ValueError(
          f'pre-aggregation {self.pre_aggregation.name} mixes every row, and combiner'
          f' {self.combiner.name} reads only their sums: use a robust combiner.'
        )
    self.check()

  @property
  def name(self) -> str:
    pre = [] if self.pre_aggregation is None else [self.pre_aggregation.name]
    return '+'.join([*(s.name for s in self.stages), *pre, self.combiner.name])

  @property
  def decomposable(self) -> bool:
    return self.combiner.decomposable

  @property
  def weighted(self) -> bool:
    """Whether the clients' weights count (False: every client alike, as DP and the
    robust combiners)."""
    return self.combiner.weighted

  def structure(self) -> str:
    """What a program of this chain holds: its stages' and combiner's settings but
    those their states hold (`in_state`). Chains of one structure differ only in their
    initial states, so one build runs them all, each from its own (`tff_comp.trials`)."""
    return repr(_structure(self))

  def bind(self, d: int) -> 'Chain':
    """This chain for models of `d` floats (each stage bound to the length its rows
    have there)."""
    stages = []
    for stage in self.stages:
      stages.append(stage.bind(d))
      d = stages[-1].output_size(d)
    return Chain(tuple(stages), self.combiner.bind(d), self.pre_aggregation)

  @property
  def row_size(self) -> int:
    return sum(s.row_size for s in self.stages)

  @property
  def randomized(self) -> bool:
    return any(s.randomized for s in self.stages)

  @property
  def cohort_wide(self) -> bool:
    return any(s.cohort_wide for s in self.stages)

  @property
  def by_client(self) -> bool:
    return any(s.by_client for s in self.stages)

  @property
  def exact_under_xla(self) -> bool:
    return all(s.exact_under_xla for s in self.stages)

  def initial_state(self) -> ChainState:
    return ChainState(tuple(s.initial_state() for s in self.stages), self.combiner.initial_state())

  def encode(
    self, state: ChainState, x: tf.Tensor, weights: tf.Tensor, rows: tf.Tensor, seeds: tf.Tensor
  ) -> Encoded:
    """Every stage's encode in order; each stage reads and writes its own slice of the
    persistent rows and draws from its own stream of each client's seed."""
    counts, new_rows, start = {}, [], 0
    for i, (stage, stage_state) in enumerate(zip(self.stages, state.stages)):
      own = rows[:, start : start + stage.row_size]
      start += stage.row_size
      encoded = stage.encode(stage_state, x, weights, own, _fold(seeds, i))
      x, weights = encoded.values, encoded.weights
      new_rows.append(encoded.rows)
      counts.update({f'{i}/{k}': v for k, v in encoded.counts.items()})
    rows_out = tf.concat(new_rows, 1) if new_rows else tf.zeros([tf.shape(x)[0], 0], x.dtype)
    return Encoded(x, weights, rows_out, counts)

  def sums(self, state: ChainState, encoded: Encoded) -> Sums:
    """A share's `Sums` (the combiner's, or its rows when it needs every row)."""
    counts = {k: tf.reduce_sum(v, 0) for k, v in encoded.counts.items()}
    clients = tf.cast(tf.shape(encoded.values)[0], tf.float32)
    weight = tf.reduce_sum(encoded.weights)
    if self.decomposable:
      return Sums(
        self.combiner.sums(state.combiner, encoded.values, encoded.weights),
        (),
        (),
        counts,
        clients,
        weight,
      )
    forged = [v for k, v in encoded.counts.items() if k.split('/', 1)[1] == ATTACKERS]
    # A row two attack stages forged counts once.
    marks = tf.minimum(tf.add_n(forged), 1.0) if forged and self.combiner.selects else ()
    return Sums((), encoded.values, encoded.weights, counts, clients, weight, marks)

  def finish(
    self, state: ChainState, total: Sums, seed: tf.Tensor
  ) -> tuple[tf.Tensor, ChainState, Measurements]:
    """(the model update [d], the new state, measurements) from the cohort's `Sums`
    (shares' added; rows concatenated); `seed` [2] the round's."""
    if self.decomposable:
      y, scale, combiner_state, measured = self.combiner.from_sums(state.combiner, total.combined)
    else:
      values, weights, marks = total.values, total.weights, total.marks
      if self.pre_aggregation is not None:
        mix_seed = _fold(seed, 2 * len(self.stages))
        if not isinstance(marks, tuple):
          marks = self.pre_aggregation.mix_marks(values, marks, mix_seed)
        values, weights = self.pre_aggregation.mix(values, weights, mix_seed)
      y, scale, combiner_state, measured = self.combiner.combine(state.combiner, values, weights)
      selected = measured.pop(ROWS_SELECTED, None)
      if selected is not None and marks is not None and not isinstance(marks, tuple):
        measured['attackers_selected'] = tf.math.divide_no_nan(
          tf.reduce_sum(selected * marks), tf.reduce_sum(selected)
        )
    context = Context(total.clients, total.weight, scale)
    measurements: Measurements = Measurements()
    states: list[Any] = [None] * len(self.stages)
    for i in reversed(range(len(self.stages))):
      own = {k.split('/', 1)[1]: v for k, v in total.counts.items() if k.startswith(f'{i}/')}
      y, states[i], stage_measured = self.stages[i].decode(
        state.stages[i], y, own, context, _fold(seed, len(self.stages) + i)
      )
      measurements.update(stage_measured)
    measurements.update(measured)
    return y, ChainState(tuple(states), combiner_state), measurements

  def aggregate(
    self,
    state: ChainState,
    x: tf.Tensor,
    weights: tf.Tensor,
    rows: tf.Tensor,
    seeds: tf.Tensor,
    seed: tf.Tensor,
  ) -> tuple[tf.Tensor, tf.Tensor, ChainState, Measurements]:
    """(the model update, the clients' new persistent rows, the new state,
    measurements) of one cohort whole: encode, sums, finish."""
    encoded = self.encode(state, x, weights, rows, seeds)
    update, state, measured = self.finish(state, self.sums(state, encoded), seed)
    return update, encoded.rows, state, measured

  def upload_bits(self, d: int) -> float:
    """Bits each client sends for its model part of `d` floats (32 a float)."""
    bits = 32.0 * d
    for stage in self.stages:
      bits = stage.upload_bits(d, bits)
      d = stage.output_size(d)
    return self.combiner.upload_bits(d, bits)

  def check(self) -> None:
    """Raises ValueError (one line) for a chain that cannot work (a stage's `why_not`)."""
    for stage in self.stages:
      reason = stage.why_not(self)
      if reason:
        raise ValueError(f'aggregator {self.name}: {reason}.')


def noises_a_sum(chain: 'Chain', mechanism: str) -> str:
  """'' when `chain`'s combiner is a scaled sum, else why `mechanism` (noise added to
  the clipped updates' sum) cannot work in it: a stage's `why_not`."""
  if chain.combiner.scaled_sum:
    return ''
  return (
    f'{mechanism} noises a sum of the clipped updates; the {chain.combiner.name} combiner'
    ' is not one'
  )


def _structure(value: Any) -> Any:
  """`value`'s settings, recursively, as comparable tuples (`Chain.structure`)."""
  if isinstance(value, (Stage, Combiner, PreAggregation)):
    held = (k for k in sorted(vars(value)) if k not in value.in_state)
    return (type(value).__name__, tuple((k, _structure(getattr(value, k))) for k in held))
  if isinstance(value, Chain) or dataclasses.is_dataclass(value):
    fields = dataclasses.fields(value)
    return (
      type(value).__name__,
      tuple((f.name, _structure(getattr(value, f.name))) for f in fields),
    )
  if isinstance(value, (tuple, list)):
    return tuple(_structure(v) for v in value)
  return repr(value)


def _fold(seeds: tf.Tensor, i: int) -> tf.Tensor:
  """Stream `i` of each seed ([..., 2] int64 seeds)."""
  return seeds + tf.constant([0, 1_000_003], tf.int64) * (i + 1)


def flatten(stacked: Any) -> tf.Tensor:
  """A cohort's stacked structure ([m, ...] leaves) as rows [m, d], float32."""
  leaves = tf.nest.flatten(stacked)
  m = tf.shape(leaves[0])[0]
  return tf.concat([tf.reshape(tf.cast(leaf, tf.float32), [m, -1]) for leaf in leaves], 1)


def unflatten(vector: tf.Tensor, like: Any) -> Any:
  """`vector` [d] in the structure and dtypes of `like`, one row's leaves."""
  leaves, parts, start = tf.nest.flatten(like), [], 0
  for leaf in leaves:
    size = leaf.shape.num_elements()
    parts.append(tf.cast(tf.reshape(vector[start : start + size], leaf.shape), leaf.dtype))
    start += size
  return tf.nest.pack_sequence_as(like, parts)


# Salt of the aggregators' seeds, so their draws never repeat the clients' draws of the
# same run seed (shuffling, epochs).
_SALT = 0x5EED_D9


def round_seed(run_seed: Any, round_num: Any) -> tf.Tensor:
  """The round's server-side seed [2] (a chain's decodes: DP noise)."""
  return tf.stack([tf.cast(run_seed, tf.int64) + _SALT, tf.cast(round_num, tf.int64)])


def client_seeds(run_seed: Any, round_num: Any, indices: tf.Tensor) -> tf.Tensor:
  """Each client's seed [m, 2] of a round, from (run seed, round, its index in the
  population): the same whatever cohort, runtime or Ray actor it is in."""
  second = tf.cast(round_num, tf.int64) * 2**24 + tf.cast(indices, tf.int64)
  first = tf.fill(tf.shape(second), tf.cast(run_seed, tf.int64) + 2 * _SALT)
  return tf.stack([first, second], 1)
