"""absl flags for experiments, derived from the registered builders' signatures.

Common flags cover what every run sets. Each algorithm's extra keyword-only
hyperparameters become a flag of the same name (shared when two algorithms use the
same name); each task option becomes `--<task>_<option>`. Plugin flags default to
None, so a flag is passed on only when given, and a flag given for an algorithm or
task that was not chosen is an error.
"""

import inspect
import json
import logging as std_logging
import pathlib
import sys
from typing import Any

from absl import flags, logging

from tff_comp import experiment, registry, settings
from tff_comp.binaries import flag_check
from tff_comp.config import builder_options, experiment_config
from tff_comp.runtime import choice

_DEFINE = {
  float: flags.DEFINE_float,
  int: flags.DEFINE_integer,
  bool: flags.DEFINE_bool,
  str: flags.DEFINE_string,
}


fail = flag_check.fail


def _help_text() -> str:
  """The binary's usage and its own flags (not those every imported library defines,
  absl.testing's and TensorFlow's TPU flags among them, which absl's --helpfull lists)."""
  main = sys.modules['__main__']
  return '\n'.join(
    [
      (main.__doc__ or '').strip() + '\n',
      flags.FLAGS.main_module_help(),
      flags.FLAGS.module_help(__name__),
      '\nAlso --flagfile=FILE (flags, one a line) and --verbosity=N (absl logging).',
    ]
  )


def quiet_logs() -> None:
  """absl logs at WARNING unless --verbosity is given: TFF's INFO chatter (a line per
  saved checkpoint) and TensorFlow's are not for users."""
  if not flags.FLAGS['verbosity'].present:
    logging.set_verbosity(logging.WARNING)
    tf_logger = std_logging.getLogger('tensorflow')  # TF's own Python logger
    tf_logger.setLevel(max(tf_logger.level, std_logging.WARNING))


def parse_or_fail(argv: list[str]) -> list[str]:
  """absl's `flags_parser` for app.run: parses, and a bad flag, value or flagfile exits
  2 with one line (absl's own parser prints its usage text and exits 1)."""
  flag_check.record(
    flags.FLAGS,
    flag_check.program(),
    bounds={  # for the next start's check
      spec.flag: dict(lower=spec.lower, upper=spec.upper, above=spec.above)
      for spec in _common_specs()
      if spec.type in (int, float) and (spec.lower, spec.upper, spec.above) != (None,) * 3
    },
    help_text=_help_text,
  )
  flag_check.check_shape(argv)
  if flag_check.asks_help(argv):
    print(_help_text())
    sys.exit(0)
  try:
    return flags.FLAGS(argv)
  except UnicodeDecodeError as e:
    fail(f'a --flagfile is not a text file of flags ({e}).')
  except (flags.Error, OSError) as e:
    fail(e)


def _listing(table: registry.Registry) -> str:
  """'name: one line' per registered name."""
  return '\n'.join(f'  {name}: {table.get(name).summary}' for name in table.names())


def _define(h: registry.Hparam, flag: str, help_text: str, choices=()) -> None:
  """A flag for hyperparameter `h` (an enum when it has choices), default None."""
  if choices:
    flags.DEFINE_enum(flag, None, [str(c) for c in choices], help_text)
  elif h.type is int:
    flags.DEFINE_integer(flag, None, help_text, upper_bound=settings.MAX_INT32)
  else:
    _DEFINE[h.type](flag, None, help_text)


def _common_specs() -> list[settings.Spec]:
  """Every setting ExperimentConfig collects: its own, then each record's, then each
  registered runtime's."""
  runtimes = [type(record) for record in choice.runtime_options().values()]
  return [
    *settings.specs(experiment.ExperimentConfig),
    *(
      spec
      for record in [*experiment_config.GROUPS.values(), *runtimes]
      for spec in settings.specs(record)
    ),
  ]


def define_common_flags() -> None:
  """Flags shared by every run: --algo, --task and one per setting of
  `experiment.ExperimentConfig` and its records (`tff_comp.settings`)."""
  flags.DEFINE_string(
    'algo', 'feddualavg', 'Registered algorithm:\n' + _listing(registry.ALGORITHMS)
  )
  flags.DEFINE_string(
    'task',
    None,
    "Registered task (default: the algorithm's home task,"
    ' with settings that work for the pair; else lasso):\n' + _listing(registry.TASKS),
  )
  for spec in _common_specs():
    default = None if spec.parse else spec.default
    if spec.choices:
      flags.DEFINE_enum(spec.flag, default, list(spec.choices), spec.help)
    elif spec.type is int:  # absl bounds: an absurd value is a flag error, not an overflow
      flags.DEFINE_integer(
        spec.flag, default, spec.help, lower_bound=spec.lower, upper_bound=spec.upper
      )
    else:
      _DEFINE[spec.type](spec.flag, default, spec.help)


def _plugin_flags() -> tuple[dict[str, list[str]], dict[str, tuple[str, str]]]:
  """(algorithm flag -> algorithms using it, task flag -> (task, option))."""
  algo_flags: dict[str, list[str]] = {}
  types: dict[str, type] = {}
  for name in registry.ALGORITHMS.names():
    for h in builder_options.record_type('algorithm', name).hparams.values():
      if types.setdefault(h.name, h.type) is not h.type:
        first = algo_flags[h.name][0]
        pair = sorted(
          [(name, h.type), (first, types[h.name])],
          key=lambda p: registry.get_algorithm(p[0]).builder.__module__.startswith('tff_comp.'),
        )  # the plugin first
        (a, a_type), (b, b_type) = pair
        raise registry.RegistryError(
          f'--{h.name}: algorithm {a!r} ({registry.get_algorithm(a).builder.__module__})'
          f' takes it as {a_type.__name__}, {b!r}'
          f' ({registry.get_algorithm(b).builder.__module__}) as {b_type.__name__};'
          ' rename one of the options.'
        )
      algo_flags.setdefault(h.name, []).append(name)
  task_flags = {}
  for name in registry.TASKS.names():
    for option in builder_options.record_type('task', name).hparams:
      task_flags[f'{name}_{option}'] = (name, option)
  return algo_flags, task_flags


def _default(h: registry.Hparam) -> str:
  return '' if h.default is inspect.Parameter.empty else f' (default {h.default!r})'


def define_plugin_flags() -> tuple[dict[str, list[str]], dict[str, tuple[str, str]]]:
  """Defines algorithm and task option flags; returns their owners."""
  algo_flags, task_flags = _plugin_flags()
  for flag, users in algo_flags.items():
    owners = [
      (user, builder_options.record_type('algorithm', user).hparams[flag]) for user in users
    ]
    choices = sorted({c for _, h in owners for c in h.choices})
    texts = {registry.get_algorithm(u).option_help(flag) for u in users}
    if len(texts) == 1:  # one meaning: say it once, then who takes it
      text = f'{texts.pop()} Option of ' + ', '.join(f'{u}{_default(h)}' for u, h in owners) + '.'
    else:
      text = ' '.join(
        f'{u}{_default(h)}: {registry.get_algorithm(u).option_help(flag)}' for u, h in owners
      )
    _define(owners[0][1], flag, text.strip(), choices)
  for flag, (task, option) in task_flags.items():
    h = builder_options.record_type('task', task).hparams[option]
    help_text = registry.get_task(task).option_help(option)
    _define(h, flag, f'Task {task}{_default(h)}: {help_text}'.strip(), h.choices)
  return algo_flags, task_flags


def _recorded_for_resume(values: flags.FlagValues) -> experiment.ExperimentConfig | None:
  """With --resume and an --output_dir holding a readable config.json: the settings that
  run recorded, which the flags given on the command line then change (the resume
  check refuses changes that are not resumable). None otherwise: an unreadable record,
  or one naming an algorithm or task not registered here, is the resume check's to
  refuse."""
  if not values.resume or not values.output_dir:
    return None
  try:
    recorded = json.loads((pathlib.Path(values.output_dir) / 'config.json').read_text())
    return experiment.ExperimentConfig.from_dict(recorded)
  except (OSError, ValueError, TypeError, AttributeError, registry.RegistryError):
    return None


def _setting_of(config: experiment.ExperimentConfig, name: str) -> Any:
  """A setting of `config` by name: its own, a record's, or a runtime's."""
  runtime = choice.setting_owners().get(name)
  if runtime is not None:
    return getattr(config.runtime_options[runtime], name)
  return config.value(name)


def config_from_flags(
  values: flags.FlagValues,
  algo_flags: dict[str, list[str]],
  task_flags: dict[str, tuple[str, str]],
) -> experiment.ExperimentConfig:
  """The ExperimentConfig the command line asks for.

  Raises:
    experiment.ConfigError: a task flag given for another task.
    registry.RegistryError: an unknown algorithm.
  """
  base = _recorded_for_resume(values)
  algorithm = values.algo if base is None or values['algo'].present else base.algorithm
  task_name = values.task if base is None or values['task'].present else base.task
  same = base is not None and (algorithm, task_name) == (base.algorithm, base.task)
  algorithm_options = dict(base.algorithm_options) if same else {}
  algorithm_options.update({f: values[f].value for f in algo_flags if values[f].present})
  chosen = experiment_config.task_of(algorithm, task_name)
  task_options = dict(base.task_options) if same else {}
  for flag, (task, option) in task_flags.items():
    if values[flag].present:
      if task != chosen:
        raise experiment.ConfigError(f'--{flag} is an option of task {task!r}, not of {chosen!r}.')
      task_options[option] = values[flag].value
  common = {}
  for spec in _common_specs():
    if base is not None and not values[spec.flag].present:
      common[spec.name] = _setting_of(base, spec.name)  # as recorded, held as it was
      continue
    value = values[spec.flag].value
    if spec.parse is not None:  # given as a string, held otherwise
      if value is None:
        continue
      try:
        value = spec.parse(value)
      except ValueError as e:
        raise experiment.ConfigError(str(e)) from e
    common[spec.name] = value
  return experiment.ExperimentConfig.of(
    algorithm=algorithm,
    task=task_name,
    algorithm_options=algorithm_options,
    task_options=task_options,
    **common,
  )
