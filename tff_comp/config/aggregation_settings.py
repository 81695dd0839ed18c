"""The run's aggregation: what `--aggregator` combines the model deltas with (the
algorithm's mean, a clipping or DP mechanism whose settings are
`privacy_settings.PrivacyOptions`', or a robust combiner), a pre-aggregation, worker
momentum, compression, secure aggregation and simulated attackers, assembled into the
aggregator chain every runtime runs (`ops.aggregators`; docs/aggregators.md):

    [momentum] -> [attack] -> [clip | DP clip] -> [rotation] -> [compression, error
    feedback] -> [pre-aggregation] -> combiner: mean (DP: sum / n) | a robust one |
    majority vote (sign) | secure sum

Mechanisms, combiners, pre-aggregations, attacks and compressors are registered blocks
(`registry.register_combiner` and its siblings); the blocks' settings join this record
(the mechanisms' are the privacy record's).
"""

import dataclasses
import typing
from typing import Any

from tff_comp import registry, settings
from tff_comp.ops import aggregators

ERROR_FEEDBACK = ('none', 'ef', 'ef21')
MEAN = 'mean'  # the algorithm's own aggregation


def aggregator_names() -> tuple[str, ...]:
  """The --aggregator choices: the mean, every registered mechanism and combiner."""
  return (MEAN, *registry.MECHANISMS.names(), *registry.COMBINERS.names())


def block_lines(blocks: registry.Registry) -> str:
  """Each registered block with its line and its flags, for the help of the flag that
  chooses among them: 'name: its docstring's first sentence [--its_flag]; ...'."""
  said = []
  for name in blocks.names():
    entry = blocks.get(name)
    fields = dataclasses.fields(entry.options) if entry.options is not None else ()
    flags = ', '.join(f'--{f.name}' for f in fields)
    said.append(f'{name}: {entry.summary.rstrip(".")}' + (f' [{flags}]' if flags else ''))
  return '; '.join(said)


@dataclasses.dataclass(frozen=True)
class _AggregationOptions:
  """The choices among registered blocks, error feedback, worker momentum and secure
  aggregation; `AggregationOptions` adds every registered block's settings."""

  aggregator: str = settings.setting(
    MEAN,
    "What combines the model deltas (side channels stay exact): mean (the algorithm's"
    ' own); clipping and DP (docs/privacy.md): '
    + block_lines(registry.MECHANISMS)
    + '; the registered combiners, every client alike (docs/aggregators.md): '
    + block_lines(registry.COMBINERS)
    + '.',
    choices=aggregator_names,
  )
  pre_aggregation: str = settings.setting(
    'none',
    "Rows mixed before the robust --aggregator reads them (the server's; every client"
    ' alike): none; ' + block_lines(registry.PRE_AGGREGATIONS) + '.',
    choices=lambda: ('none', *registry.PRE_AGGREGATIONS.names()),
    applies_when={'aggregator': tuple(registry.COMBINERS.names())},
  )
  compression: str = settings.setting(
    'none',
    'What each client sends in fewer bits (comm/upload_bytes reports the bits): none; '
    + block_lines(registry.COMPRESSORS)
    + '.',
    choices=lambda: ('none', *registry.COMPRESSORS.names()),
  )
  error_feedback: str = settings.setting(
    'none',
    'Error feedback around the compression: ef (Karimireddy et al. 2019) or ef21'
    " (Richtarik et al. 2021), a residual of the model's size kept per client"
    ' (in-process runtime). Needs a contractive compressor: top_k, sign, or rand_k'
    ' (then unscaled, not d/k); quantize and qsgd are refused.',
    choices=ERROR_FEEDBACK,
    applies_when={'compression': tuple(registry.COMPRESSORS.names())},
  )
  worker_momentum: float = settings.setting(
    0.0,
    'Each client sends its momentum m_i <- beta m_i + (1 - beta) u_i across rounds in'
    " place of its update u_i (Karimireddy, He and Jaggi 2021's worker momentum; a row"
    " of the model's size kept per client, in-process runtime); 0: none.",
    lower=0.0,
    upper=0.999,
  )
  secure_aggregation: bool = settings.setting(
    False,
    "Sum the updates as secure aggregation does (TFF's secure_aggregator): each"
    ' value clipped to +-(--secure_bound), mapped to --secure_bits integers, summed'
    ' modulo 2^(--secure_sum_bits).',
  )
  secure_bound: float = settings.setting(
    1.0,
    '--secure_aggregation: the bound r of each (weighted) value.',
    lower=settings.FLOAT32_TINY,
    upper=settings.FLOAT32_HUGE,
    applies_when={'secure_aggregation': (True,)},
  )
  secure_bits: int = settings.setting(
    20,
    "--secure_aggregation: bits of each value's integer.",
    lower=1,
    upper=32,
    applies_when={'secure_aggregation': (True,)},
  )
  secure_sum_bits: int | None = settings.setting(
    None,
    '--secure_aggregation: bits of the modulus (default: --secure_bits plus'
    ' log2 of the cohort, which never wraps; fewer wrap, counted in'
    ' train/aggregator/secure_wrapped).',
    lower=1,
    upper=62,
    applies_when={'secure_aggregation': (True,)},
  )
  attack: str = settings.setting(
    'none',
    'Byzantine clients, simulated (each client of a round an attacker with probability'
    ' --attack_fraction, drawn from (seed, round, client), but for label_flip):'
    ' none; ' + block_lines(registry.ATTACKS) + '.',
    choices=lambda: ('none', *registry.ATTACKS.names()),
  )

  def __post_init__(self):
    settings.check(self)
    compression = self._compression(0)
    ef = self.error_feedback != 'none'
    if ef and compression and not compression[-1].for_error_feedback().contractive:
      raise ValueError(
        f'--error_feedback={self.error_feedback} needs a contractive compressor, and'
        f' --compression={self.compression} is not (its residuals grow without bound):'
        ' use top_k, sign or rand_k.'
      )

  @property
  def private(self) -> bool:
    """Whether --aggregator is a DP mechanism (`ops.privacy.PrivateMean.private`)."""
    names = registry.MECHANISMS.names()
    mechanism = (
      registry.MECHANISMS.get(self.aggregator).builder if self.aggregator in names else None
    )
    return bool(getattr(mechanism, 'private', False))

  @property
  def active(self) -> bool:
    """Whether any of these settings changes the aggregation."""
    return (
      self.compression != 'none'
      or self.secure_aggregation
      or self.worker_momentum > 0
      or self._attack(0) is not None  # label flipping poisons the data, not the updates
    )

  def chain(self, private: aggregators.Chain | None, clients_per_round: int) -> aggregators.Chain:
    """The chain of these settings around `private` (the chain of the clipping or DP
    mechanism --aggregator names, if it does).

    Raises:
      ValueError: (one line) a combination that cannot work.
    """
    stages: list[aggregators.Stage] = []
    if self.worker_momentum:  # the honest clients' momenta, which attackers then forge from
      stages.append(aggregators.WorkerMomentum(self.worker_momentum))
    attack = self._attack(clients_per_round)
    if attack is not None:
      stages.append(attack)
    if private is not None:
      stages.extend(private.stages)
    compression = self._compression(clients_per_round)
    if compression:
      *before, compressor = compression
      stages.extend(before)
      if self.error_feedback != 'none':
        compressor = aggregators.ErrorFeedback(compressor.for_error_feedback(), self.error_feedback)
      stages.append(compressor)
    votes = bool(compression) and compression[-1].votes
    pre, rows, given = None, clients_per_round, f'--clients_per_round={clients_per_round}'
    if self.pre_aggregation != 'none':
      pre = self._built(registry.PRE_AGGREGATIONS.get(self.pre_aggregation), clients_per_round)
      needed, why = pre.min_rows()
      if clients_per_round < needed:
        raise ValueError(
          f'--pre_aggregation={self.pre_aggregation} needs at least {needed} clients a round'
          f' ({why}): {given}.'
        )
      rows = pre.rows(clients_per_round)
      given += f' gives {rows} after --pre_aggregation={self.pre_aggregation}'
    combiner = self._combiner(private, rows, votes)
    needed, why = combiner.min_rows()
    if rows < needed:
      raise ValueError(
        f'--aggregator={self.aggregator} needs at least {needed} rows a round ({why}): {given}.'
      )
    return aggregators.Chain(tuple(stages), combiner, pre)

  def _attack(self, clients_per_round: int) -> aggregators.Stage | None:
    if self.attack == 'none':
      return None
    return self._built(registry.ATTACKS.get(self.attack), clients_per_round)

  def options_of(self, entry: registry.Entry) -> Any:
    """The registered block `entry`'s settings record, its fields read off these (None:
    the block has no settings)."""
    if entry.options is None:
      return None
    return entry.options(
      **{f.name: getattr(self, f.name) for f in dataclasses.fields(entry.options)}
    )

  def _built(self, entry: registry.Entry, clients_per_round: int) -> Any:
    """The registered block `entry` built with its settings record."""
    return entry.build(self.options_of(entry), clients_per_round)

  def _compression(self, clients_per_round: int) -> tuple[aggregators.Stage, ...]:
    """The compressor's stages, the compressor last (none: ())."""
    if self.compression == 'none':
      return ()
    return tuple(self._built(registry.COMPRESSORS.get(self.compression), clients_per_round))

  def _combiner(
    self,
    private: aggregators.Chain | None,
    rows: int,
    votes: bool,
  ) -> aggregators.Combiner:
    aggregator = self.aggregator
    if aggregator in registry.COMBINERS.names():
      if self.secure_aggregation:
        raise ValueError(
          f"--aggregator={aggregator} needs each client's update, while"
          ' --secure_aggregation reveals only their total.'
        )
      return self._built(registry.COMBINERS.get(aggregator), rows)
    if self.secure_aggregation:
      if private is not None and not private.combiner.weighted:
        raise ValueError(
          '--secure_aggregation with a DP --aggregator is distributed DP,'
          ' which is not built yet; use --aggregator=clip or mean.'
        )
      return aggregators.SecureSum(
        self.secure_bound,
        self.secure_bits,
        self.secure_sum_bits,
        max_clients=max(rows, 2),
      )
    if votes and private is None:
      return aggregators.MajorityVote()
    return private.combiner if private is not None else aggregators.Mean()


def upload_bytes(chain: aggregators.Chain | None, d: int, side_floats: int) -> float:
  """Bytes a client sends a round: its model part (the chain's bits, 32 a float without
  one) and its update's other fields (`side_floats` floats, exact)."""
  bits = 32.0 * d if chain is None else chain.upload_bits(d)
  return (bits + 32.0 * side_floats) / 8.0


def _choosers() -> dict[str, registry.Registry]:
  """The flags choosing registered blocks, and the registries they choose from."""
  return {
    'aggregator': registry.COMBINERS,
    'pre_aggregation': registry.PRE_AGGREGATIONS,
    'attack': registry.ATTACKS,
    'compression': registry.COMPRESSORS,
  }


def _block_fields() -> list[tuple[str, Any, Any]]:
  """The fields of every registered block's settings record (`registry.
  register_combiner`, `register_pre_aggregation`), each applying where the flag choosing
  among them (`_choosers`) names a block declaring it (so a field several blocks
  declare, as Krum's, Bulyan's and NNM's f, must be declared alike), its help prefixed
  by those choices."""
  declared: dict[str, tuple[Any, dataclasses.Field, dict[str, list[str]]]] = {}
  own = {f.name for f in dataclasses.fields(_AggregationOptions)}
  for flag, blocks in _choosers().items():
    for name in blocks.names():
      record = blocks.get(name).options
      if record is None:
        continue
      hints = typing.get_type_hints(record)
      for field in dataclasses.fields(record):
        if field.name in own:
          raise registry.RegistryError(
            f'{blocks.kind} {name!r} declares --{field.name}, a setting of the aggregation record.'
          )
        if field.name not in declared:
          declared[field.name] = (hints[field.name], field, {flag: [name]})
          continue
        hint, first, by_flag = declared[field.name]
        if (hint, first.default, dict(first.metadata)) != (
          hints[field.name],
          field.default,
          dict(field.metadata),
        ):
          earlier = next(iter(by_flag.values()))[0]
          raise registry.RegistryError(
            f'{blocks.kind} {name!r} declares --{field.name} unlike {earlier!r} does.'
          )
        by_flag.setdefault(flag, []).append(name)
  return [
    (
      field_name,
      hint,
      dataclasses.field(
        default=field.default,
        metadata={
          **field.metadata,
          'help': ' or '.join(f'--{flag}={"/".join(names)}' for flag, names in by_flag.items())
          + f': {field.metadata["help"]}',
          'applies_when': {flag: tuple(names) for flag, names in by_flag.items()},
          'applies_when_any': True,
        },
      ),
    )
    for field_name, (hint, field, by_flag) in declared.items()
  ]


# The run's aggregation settings: `_AggregationOptions`' and, derived from the registry,
# every registered combiner's and pre-aggregation's (a plugin's too); config.json holds
# them as one record. A type checker sees the static part (the fields code names; the
# blocks' are read by name from the registry).
if typing.TYPE_CHECKING:
  AggregationOptions = _AggregationOptions
else:
  AggregationOptions = dataclasses.make_dataclass(
    'AggregationOptions',
    _block_fields(),
    bases=(_AggregationOptions,),
    frozen=True,
  )
  AggregationOptions.__module__ = __name__  # found by pickle (make_dataclass's own, 3.12)
  AggregationOptions.__doc__ = """Robust combiners' and pre-aggregations' settings (each
  registered block's record, its fields here), compression, secure aggregation, attackers."""
