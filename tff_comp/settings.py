"""Settings records: each module owns its run settings as a frozen dataclass.

A record's fields carry what a setting is beyond its type and default: its help text
(the binaries' flag, one per field, named as the field), its choices and bounds. The
module that owns a record also owns its validation (`check`, raising ValueError whose
message starts with the flag) and reads it; `experiment.ExperimentConfig` only collects
records, `binaries/flags_lib.py` defines flags from their fields, and config.json holds
each record under its name. A new setting is one field in its module's record.

absl's flags could declare these themselves, but a record is also the Python API
(`ExperimentConfig(privacy=PrivacyOptions(...))`) and what config.json reruns from,
without absl or a command line: so the fields are the one source and flags derive.
"""

from collections.abc import Callable, Iterator, Mapping, Sequence
import copy
import dataclasses
import math
import numbers
import sys
import types
import typing
from typing import Any

MAX_INT32, MAX_COUNT, MAX_SEED = 2**31 - 1, 10**8, 2**32 - 1
# Bounds of a positive setting the round holds as a float32, with room for arithmetic:
# 1e-300 became 0 (the model never moved) and 1e300 inf (reported as a divergence).
FLOAT32_TINY, FLOAT32_HUGE = 1e-30, 1e30


class ConfigError(ValueError):
  """Bad experiment settings; the message is one line for the user."""


def setting(
  default: Any = None,
  help: str = '',
  *,
  choices: Sequence[str] | Callable[[], Sequence[str]] = (),
  lower: float | None = None,
  upper: float | None = None,
  above: float | None = None,
  flag: str | None = None,
  parse: Callable[[str], Any] | None = None,
  default_factory: Callable[[], Any] | None = None,
  input_file: bool = False,
  resumable: bool = False,
  per_trial: bool = False,
  chain_state: bool = False,
  applies_when: Mapping[str, Sequence[Any]] | None = None,
  applies_when_any: bool = False,
) -> Any:
  """A record field: `default`, the flag's `help`, its `choices` (or a function giving
  them, for registries filled later), inclusive `lower`/`upper` or exclusive `above`
  bounds, another `flag` name than the field's, and `parse` for a flag given as a
  string that the field holds otherwise (a list of addresses). `input_file`: the value
  is the path of a file the run reads (a device trace): config.json records its
  fingerprint and `--resume` refuses the run if it changed (`input_files`).
  `resumable`: a resumed run may change it (where it writes, how long it runs, how it
  saves, where its rounds run), the rest must match the recorded run's.
  `per_trial`: trials of a grid that differ in it may share one compiled program
  (`tff_comp.trials`): it lives in the loop, the sampler or the hyperparameters, never
  in what is compiled. `chain_state`: an aggregator block holds it in its state (its
  `in_state`), so trials differing in it share a build, each starting its chain from its
  own state (`tff_comp.trials`). `applies_when` {setting: its values}: the setting only matters
  where every named setting (of any record, by its flag's name) has one of those
  values (`GIVEN`: any but None); set otherwise, it would be ignored, and the run
  refuses it (`ignored_settings`); `applies_when_any`: where any one of them has."""
  metadata = dict(
    help=help,
    choices=choices,
    lower=lower,
    upper=upper,
    above=above,
    flag=flag,
    parse=parse,
    input_file=input_file,
    resumable=resumable,
    per_trial=per_trial,
    chain_state=chain_state,
    applies_when=dict(applies_when or {}),
    applies_when_any=applies_when_any,
  )
  if default_factory is not None:
    return dataclasses.field(default_factory=default_factory, metadata=metadata)
  return dataclasses.field(default=default, metadata=metadata)


@dataclasses.dataclass(frozen=True)
class Spec:
  """One setting as the binaries see it."""

  name: str  # the field
  flag: str
  type: type  # bool, int, float or str (the flag's; None allowed beside it)
  default: Any
  help: str
  choices: tuple[str, ...]
  lower: float | None
  upper: float | None
  above: float | None
  parse: Callable[[str], Any] | None
  input_file: bool
  resumable: bool
  per_trial: bool
  chain_state: bool
  applies_when: Mapping[str, Sequence[Any]]
  applies_when_any: bool
  annotation: Any = None  # the field's own (`int | None`, `tuple[str, ...]`): what `check` types


def _base_type(hint: Any) -> type:
  """int for `int`, `int | None`; str for a tuple of str (a parsed flag)."""
  args = [a for a in typing.get_args(hint) if a is not type(None)]
  if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
    return _base_type(args[0])
  if typing.get_origin(hint) is tuple or hint is tuple:
    return str
  return hint


def specs(record: type) -> Iterator[Spec]:
  """The settings of a record class (fields without help are not settings)."""
  hints = typing.get_type_hints(record)
  for field in dataclasses.fields(record):
    meta = field.metadata
    if not meta.get('help'):
      continue
    choices = meta['choices']() if callable(meta['choices']) else meta['choices']
    factory = field.default_factory
    default = field.default if factory is dataclasses.MISSING else factory()
    yield Spec(
      field.name,
      meta['flag'] or field.name,
      _base_type(hints[field.name]),
      default,
      meta['help'],
      tuple(choices),
      meta['lower'],
      meta['upper'],
      meta['above'],
      meta['parse'],
      meta.get('input_file', False),
      meta.get('resumable', False),
      meta.get('per_trial', False),
      meta.get('chain_state', False),
      meta.get('applies_when', {}),
      meta.get('applies_when_any', False),
      hints[field.name],
    )


# `applies_when={name: GIVEN}`: the setting applies where `name` is set (not None).
GIVEN = ('<given>',)


def ignored_settings(record: Any, value: Callable[[str], Any]) -> str:
  """One line naming the first setting of `record` changed from its default whose
  `applies_when` does not hold ('' when none): `value(name)` reads any setting by its
  flag's name (`ExperimentConfig.value`). Settings a run would ignore are refused by this
  one rule, not one check per flag. With `applies_when_any`, one of the named settings
  having one of its values suffices (a setting blocks of two kinds declare)."""
  for spec in specs(type(record)):
    current = getattr(record, spec.name)
    if not spec.applies_when or current == spec.default:
      continue
    failing = [
      why
      for governing, values in spec.applies_when.items()
      if (why := _unmet(governing, values, value))
    ]
    if failing and (not spec.applies_when_any or len(failing) == len(spec.applies_when)):
      return f'--{spec.flag} applies with {" or ".join(failing)}; it would be ignored.'
  return ''


def _unmet(governing: str, values: Sequence[Any], value: Callable[[str], Any]) -> str:
  """'--governing=its values (this run's is ...)' if the setting `governing` has none of
  `values` ('' if it has one)."""
  if values is GIVEN:
    return '' if value(governing) is not None else f'--{governing} set (it is not)'
  if value(governing) in values:
    return ''
  shown = ', '.join(_flag_value(v) for v in values)
  return f"--{governing}={shown} (this run's is {_flag_value(value(governing))})"


def _flag_value(value: Any) -> str:
  return str(value).lower() if isinstance(value, bool) else str(value)


def input_files(record: Any) -> list[str]:
  """The paths of the files `record`'s settings name as inputs (`setting(input_file=
  True)`), those set."""
  return [
    getattr(record, spec.name)
    for spec in specs(type(record))
    if spec.input_file and getattr(record, spec.name) is not None
  ]


class Options(dict):
  """A name -> value mapping that cannot change: the options of a frozen record (an
  ExperimentConfig's algorithm, task and runtime options). A dict underneath, so
  `dataclasses.asdict`, json and `==` treat it as one (types.MappingProxyType cannot be
  deep-copied, which `asdict` does); a changed one is a new mapping."""

  def _refuse(self, *args: Any, **kwargs: Any) -> Any:
    raise TypeError('options cannot change: give dataclasses.replace a new mapping.')

  # One refusal for every mutator; dict's overloaded signatures are not its own.
  __setitem__ = __delitem__ = __ior__ = clear = pop = popitem = setdefault = update = _refuse  # type: ignore[assignment]

  def __reduce__(self) -> tuple[type, tuple[dict[str, Any]]]:
    return type(self), (dict(self),)

  def __deepcopy__(self, memo: dict[int, Any]) -> 'Options':
    return type(self)(copy.deepcopy(dict(self), memo))


# What a setting of each plain type takes, in the message refusing another value.
_WHAT = {bool: 'true or false', int: 'an integer', float: 'a number', str: 'a string'}


def typed(kind: type, value: Any) -> Any:
  """`value` as a setting or option of type `kind` (bool, int, float or str) takes it:
  Python's bool, int, float or str; a NumPy scalar as Python's, an integer for a float
  as a float.

  Raises:
    ValueError: (one line, without the setting's name: "takes a number, got '0.1'.")
      a value of another type, or a bool for a number.
  """
  # numbers' ABCs admit NumPy's scalars; bool is an int to Python, never a number here.
  # NumPy's bool is looked up, not imported (this module imports only the standard
  # library): without NumPy loaded no value can be one.
  bools = (bool, getattr(sys.modules.get('numpy'), 'bool_', bool))
  kinds = {bool: bools, int: (numbers.Integral,), float: (numbers.Real,), str: (str,)}
  if not isinstance(value, kinds[kind]) or (kind is not bool and isinstance(value, bools)):
    raise ValueError(f'takes {_WHAT[kind]}, got {value!r}.')
  return kind(value)


def _type_refusal(hint: Any, value: Any) -> str:
  """Why `value` does not fit the type `hint` ('' when it does): plain types as `typed`
  takes them, None where the hint admits it, tuples element by element; other types
  (records, callables) are their owners' to check."""
  args = typing.get_args(hint)
  if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
    if value is None and type(None) in args:
      return ''
    refusals = [_type_refusal(a, value) for a in args if a is not type(None)]
    return '' if '' in refusals else refusals[0]
  if typing.get_origin(hint) is tuple:
    if not isinstance(value, (tuple, list)):
      return f'takes a sequence, got {value!r}.'
    return next((why for v in value if (why := _type_refusal(args[0], v))), '') if args else ''
  if hint in _WHAT:
    try:
      typed(hint, value)
    except ValueError as e:
      return str(e)
  return ''


def check(record: Any) -> None:
  """Raises ValueError ('--flag must be ...') for a value of another type than its
  field's (`typed`), outside its choices or bounds, or a float that is not finite (inf
  or nan would only surface rounds later, as a misleading divergence)."""
  for spec in specs(type(record)):
    value = getattr(record, spec.name)
    refusal = _type_refusal(spec.annotation, value)
    if refusal:
      raise ValueError(f'--{spec.flag} {refusal}')
    if value is None or isinstance(value, bool):
      continue
    if spec.choices and isinstance(value, str) and value not in spec.choices:
      raise ValueError(
        f'--{spec.flag}={value!r} is unknown; choose one of {", ".join(spec.choices)}.'
      )
    if isinstance(value, (int, float)):
      check_bounds(spec.flag, value, spec.lower, spec.upper, spec.above)


def check_bounds(
  flag: str,
  value: float,
  lower: float | None = None,
  upper: float | None = None,
  above: float | None = None,
) -> None:
  """Raises ValueError ('--flag must be ...') for `value` outside the bounds or not
  finite (also `binaries/flag_check`'s, before TensorFlow loads)."""
  if isinstance(value, float) and not math.isfinite(value):
    raise ValueError(f'--{flag} must be a finite number, got {value}.')
  if lower is not None and value < lower:
    raise ValueError(f'--{flag} must be >= {lower}, got {value}.')
  if upper is not None and value > upper:
    raise ValueError(f'--{flag} must be <= {upper}, got {value}.')
  if above is not None and not value > above:
    raise ValueError(f'--{flag} must be > {above}, got {value}.')


def from_dict(record: type, values: dict[str, Any]) -> Any:
  """`record` from its fields' values (config.json's lists back as tuples)."""
  hints = typing.get_type_hints(record)
  return record(
    **{
      k: tuple(v) if isinstance(v, list) and typing.get_origin(hints[k]) is tuple else v
      for k, v in values.items()
    }
  )
