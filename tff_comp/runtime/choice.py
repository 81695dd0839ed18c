"""Which runtime runs a program, with which of its settings: the runtime named, or for
'auto' the first registered runtime (by `auto_rank`) that can run it. Each runtime owns
its settings record (`registry.register_runtime(options=...)`); settings reach the
runtime owning them by name, so a runtime added by a plugin needs no edit here."""

from collections.abc import Mapping
import dataclasses
from typing import Any

from tff_comp import registry
from tff_comp import settings as settings_lib
from tff_comp.runtime import base
from tff_comp.settings import ConfigError


def _with_options() -> dict[str, type]:
  """{runtime: its settings record's class} of the runtimes that declare one."""
  return {
    name: options
    for name in registry.RUNTIMES.names()
    if (options := registry.get_runtime(name).options) is not None
  }


def auto_order() -> list[str]:
  """The runtimes 'auto' tries, in order (`auto_rank`, lowest first)."""
  entries = [registry.get_runtime(name) for name in registry.RUNTIMES.names()]
  ranked = sorted(
    (e.auto_rank, i, e.name) for i, e in enumerate(entries) if e.auto_rank is not None
  )
  return [name for _, _, name in ranked]


def setting_owners() -> dict[str, str]:
  """{setting name: the runtime owning it} for every registered runtime's settings.

  Raises:
    registry.RegistryError: two runtimes claim one setting name.
  """
  owners: dict[str, str] = {}
  for name, options in _with_options().items():
    for spec in settings_lib.specs(options):
      if spec.name in owners:
        raise registry.RegistryError(
          f'runtimes {owners[spec.name]!r} and {name!r} both declare the setting {spec.name!r}.'
        )
      owners[spec.name] = name
  return owners


def runtime_options(given: Mapping[str, Any] | None = None, **values: Any) -> dict[str, Any]:
  """{runtime: its settings record} for every registered runtime with settings: the
  record in `given`, else its defaults, with `values` (settings by name) applied.

  Raises:
    ConfigError: an unknown setting, or a value its record refuses.
  """
  owners = setting_owners()
  unknown = set(values) - set(owners)
  if unknown:
    raise ConfigError(f'unknown runtime settings: {", ".join(sorted(unknown))}.')
  records = {}
  for name, options in _with_options().items():
    record = (given or {}).get(name)
    if isinstance(record, Mapping):  # as config.json holds it
      record = settings_lib.from_dict(options, dict(record))
    record = options() if record is None else record
    mine = {k: v for k, v in values.items() if owners[k] == name}
    try:  # checked here too: a plugin's record may not check itself
      records[name] = dataclasses.replace(record, **mine) if mine else record
      settings_lib.check(records[name])
    except ValueError as e:
      raise ConfigError(str(e)) from e
  return records


def _set_away_from_defaults(options: Mapping[str, Any]) -> dict[str, list[str]]:
  """{runtime: the flags of its settings not at their defaults}."""
  found = {}
  for name, record in options.items():
    default = type(record)()
    changed = [
      spec.flag
      for spec in settings_lib.specs(type(record))
      if getattr(record, spec.name) != getattr(default, spec.name)
    ]
    if changed:
      found[name] = changed
  return found


def candidates(runtime: str, options: Mapping[str, Any]) -> list[str]:
  """The runtimes to try for `runtime` ('auto' or a name): a runtime whose own settings
  are set is the one asked for.

  Raises:
    ConfigError: settings of another runtime than the one named (or of two runtimes).
  """
  if runtime != 'auto':
    registry.get_runtime(runtime)
  set_for = _set_away_from_defaults(options)
  others = {name: flags for name, flags in set_for.items() if name != runtime}
  if runtime == 'auto' and len(others) > 1:
    asked = ' and '.join(f'--{flags[0]} ({name})' for name, flags in others.items())
    raise ConfigError(f"{asked} set two runtimes' settings; give one runtime's.")
  if runtime != 'auto' and others:
    name, flags = next(iter(others.items()))
    what = 'a setting' if len(flags) == 1 else 'settings'
    raise ConfigError(
      f'--{", --".join(flags)}: {what} of the {name} runtime; for --runtime={name} or auto.'
    )
  if runtime != 'auto':
    return [runtime]
  return list(set_for) or auto_order()


def check(runtime: str, options: Mapping[str, Any]) -> None:
  """Raises ConfigError for settings that do not go with `runtime` (`candidates`), or
  a value its record refuses."""
  for record in options.values():
    try:
      settings_lib.check(record)
    except ValueError as e:
      raise ConfigError(str(e)) from e
  candidates(runtime, options)


def runner_for(
  program,
  client_data,
  runtime: str = 'auto',
  *,
  options: Mapping[str, Any] | None = None,
  batch_size: int | None = None,
  client_rounds: int | None = None,
  resumed: dict[str, Any] | None = None,
  **values: Any,
) -> tuple[base.Runtime, str]:
  """(the runtime running `program` on `client_data`, one line saying which and why).

  `program` is an Algorithm or a LearningProcess. `runtime` names a registered runtime
  (`registry.RUNTIMES`: 'inprocess', 'tff', 'ray', plugins) or 'auto': the first by
  `auto_rank` whose `why_not` says nothing, the reasons for passing over the others in
  the line (a runtime whose own settings are set is the only one tried). `options`:
  {runtime: its settings record} (`runtime_options`; default: the defaults), `values`
  settings by name over them (`engine='debug'`, `workers=(...)`). `batch_size`,
  `client_rounds` and `resumed` are the run's facts (`base.RunFacts`).

  Raises:
    ConfigError: a setting of another runtime; the named runtime cannot run the program;
      its builder refuses its settings (workers that do not answer, for instance).
  """
  options = runtime_options(options, **values)
  names = candidates(runtime, options)
  facts = base.RunFacts(batch_size, client_rounds, resumed)
  passed_over = []
  for name in names:
    entry = registry.get_runtime(name)
    try:
      why = entry.why_not(program, options.get(name)) if entry.why_not else ''
      if why:
        raise base.UnsupportedError(why)
      built = entry.build(program, client_data, options.get(name), facts)
    except base.UnsupportedError as e:
      if name == names[-1]:
        raise ConfigError(f'--runtime={name}: {e}') from e
      passed_over.append(f'not {entry.label or name}: {e}')
      continue
    why = f' ({"; ".join(passed_over)})' if passed_over else ''
    return built, built.description + why
  raise AssertionError('unreachable: the last runtime returns or raises')
