"""A registered builder's options as a typed record: one class per algorithm and per task
(`record_type`), a read-only property per option its builder declares
(`registry.Hparam`: a keyword-only parameter of a plain type; None where not given,
then the algorithm's home setting or the builder's default applies, as config.json's
`resolved` records), each value typed when the record is made. A record is the frozen
mapping of the options given (`settings.Options`), so json, `dataclasses.asdict` and
config.json hold what a script or the command line set, as before these records.

A record's class is made from the registry (a plugin's builder gets one too), so it
pickles as its builder's name and the options given (`__reduce__`), rebuilt from the
registry of the process unpickling it (pickle cannot find a class made at run time by
its name)."""

from collections.abc import Mapping
import dataclasses
import operator
import re
from typing import Any, ClassVar

from tff_comp import registry, settings
from tff_comp.settings import ConfigError

# Builder parameters that every run sets from the common flags, not options.
COMMON_ALGORITHM_ARGS = (
  'client_learning_rate',
  'server_learning_rate',
  'batch_size',
  'local_epochs',
  'client_weighting',
  'regularizer',
  'seed',
  'num_clients',
)
# Task parameters set from common settings (`--data_seed`), not options.
COMMON_TASK_ARGS = ('seed',)


@dataclasses.dataclass(frozen=True)
class Kind:
  """A kind of registered builder with options: its table, the parameters a run sets
  from common settings (not options), and whether its flags start with its name."""

  table: registry.Registry
  common: tuple[str, ...]
  flags_named: bool  # --<task>_<option>, where an algorithm's are --<option>


KINDS = {
  'algorithm': Kind(registry.ALGORITHMS, COMMON_ALGORITHM_ARGS, flags_named=False),
  'task': Kind(registry.TASKS, COMMON_TASK_ARGS, flags_named=True),
}


class BuilderOptions(settings.Options):
  """The options given to one registered builder (`kind` 'algorithm' or 'task',
  `builder` its name), typed as it declares them (`hparams`); each subclass has a
  property per option."""

  kind: ClassVar[str] = ''
  builder: ClassVar[str] = ''
  hparams: ClassVar[Mapping[str, registry.Hparam]] = {}
  flag_prefix: ClassVar[str] = ''  # 'lasso_' for task lasso's --lasso_dataset

  def __init__(self, given: Any = (), /, **options: Any) -> None:
    """`given` (a mapping or pairs {option: value}) and `options` by name
    (`record_type('algorithm', 'fedprox')(mu=0.1)`); None is not given.

    Raises:
      ConfigError: an option the builder lacks, or a value it cannot take (one line:
        `--mu takes a number, got '0.1'.`).
    """
    given = {name: value for name, value in dict(given, **options).items() if value is not None}
    unknown = sorted(set(given) - set(self.hparams))
    if unknown:
      raise ConfigError(
        f'--{self.flag_prefix}{unknown[0]} does not apply to {self.kind} {self.builder!r}'
        f' (its options: {", ".join(sorted(self.hparams)) or "none"}).'
      )
    typed = {}
    for name, value in given.items():
      try:
        typed[name] = self.hparams[name].typed(value)
      except ValueError as e:
        raise ConfigError(f'--{self.flag_prefix}{name} {e}') from e
    super().__init__(typed)

  def __setattr__(self, name: str, value: Any) -> None:
    raise AttributeError(
      f'options cannot change: give dataclasses.replace new {self.kind} options.'
    )

  def __repr__(self) -> str:
    return f'{type(self).__name__}({", ".join(f"{k}={v!r}" for k, v in self.items())})'

  def __reduce__(self) -> tuple[Any, tuple[str, str, dict[str, Any]]]:  # type: ignore[override]
    return of, (self.kind, self.builder, dict(self))


# (kind, name) -> (the entry the record was made from, the record): a name registered
# again (a test's plugin) gets a new record.
_RECORDS: dict[tuple[str, str], tuple[registry.Entry, type[BuilderOptions]]] = {}


def record_type(kind: str, name: str) -> type[BuilderOptions]:
  """The options record of the registered builder `name` of `kind`.

  Raises:
    registry.RegistryError: no such builder.
  """
  entry = KINDS[kind].table.get(name)
  made = _RECORDS.get((kind, name))
  if made is not None and made[0] is entry:
    return made[1]
  hparams = {h.name: h for h in entry.hparams if h.name not in KINDS[kind].common}
  taken = sorted(set(hparams) & set(dir(BuilderOptions)))
  if taken:  # its property would hide the mapping's own method
    raise registry.RegistryError(
      f'{kind} {name!r}: option {taken[0]!r} is a name its options record has already'
      ' (a mapping method): rename the parameter.'
    )
  words = ''.join(part.capitalize() for part in re.split(r'[^0-9A-Za-z]+', name))
  record = type(
    f'{words}{kind.capitalize()}Options',
    (BuilderOptions,),
    {
      '__module__': __name__,
      '__doc__': f'The options given to {kind} {name!r}.',
      '__annotations__': {option: h.type | None for option, h in hparams.items()},
      'kind': kind,
      'builder': name,
      'hparams': hparams,
      'flag_prefix': f'{name}_' if KINDS[kind].flags_named else '',
      **{
        option: property(operator.methodcaller('get', option), doc=entry.option_help(option))
        for option in hparams
      },
    },
  )
  _RECORDS[kind, name] = (entry, record)
  return record


def names(kind: str, name: str) -> set[str]:
  """The options of the registered builder `name` of `kind`."""
  return set(record_type(kind, name).hparams)


def of(kind: str, name: str, given: Mapping[str, Any]) -> BuilderOptions:
  """`given` options ({name: value}, None: not given) as the record of the registered
  builder `name` of `kind`; a record already of that builder as it is.

  Raises:
    registry.RegistryError: no such builder.
    ConfigError: as `BuilderOptions`.
  """
  record = record_type(kind, name)
  return given if type(given) is record else record(given)
