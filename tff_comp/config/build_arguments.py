"""A run's settings turned into what it builds, checked: the task's name, the run
directory, the task (with the data files its build read), the regularizer, the
server optimizer and the registered builder's arguments. `experiment.prepare` runs these
in order; each raises `ConfigError` with a one-line message."""

import dataclasses
from typing import Any

from tff_comp import paths, poisoning, registry
from tff_comp import task as task_lib
from tff_comp.config import run_directory, run_settings
from tff_comp.config.experiment_config import ExperimentConfig
from tff_comp.ops import regularizers as regularizers_lib
from tff_comp.settings import ConfigError


def regularizer(config, task, algorithm) -> regularizers_lib.Regularizer | None:
  chosen = config.regularizer is not None or config.regularizer_strength is not None
  if not algorithm.accepts('regularizer'):
    if chosen:
      raise ConfigError(
        f'--regularizer/--regularizer_strength do not apply to algorithm'
        f' {config.algorithm!r}, which ignores regularizers.'
      )
    return None
  name = config.regularizer or task.regularizer.name
  strength = (
    task.regularizer.strength
    if config.regularizer_strength is None
    else config.regularizer_strength
  )
  if strength < 0:
    raise ConfigError(f'--regularizer_strength must be >= 0, got {strength}.')
  try:
    psi = regularizers_lib.make_regularizer(name, strength, task.regularizer_targets)
    psi.check_applies_to(task.weight_shapes)
  except ValueError as e:
    raise ConfigError(f'task {task.name!r} cannot apply this regularizer: {e}') from e
  return psi


def with_names(config: ExperimentConfig) -> tuple[ExperimentConfig, registry.Entry]:
  """(config with its task and output directory resolved, the task's entry)."""
  task_name = config.task_name
  config = dataclasses.replace(
    config, task=task_name, output_dir=config.output_dir or f'runs/{config.algorithm}-{task_name}'
  )
  return config, registry.get_task(task_name)


def check_run_directory(config: ExperimentConfig) -> None:
  """Raises ConfigError unless the output directory is usable and the run-management
  settings are coherent (the options were checked with the config,
  `builder_options`)."""
  assert config.output_dir is not None, 'resolved first (with_names)'
  run_directory.check_output_dir(config.output_dir, config.overwrite, config.resume)
  if config.resume and config.overwrite:
    raise ConfigError(
      '--resume continues the run in --output_dir, --overwrite replaces it: choose one.'
    )
  try:
    paths.check_cache_root()
  except ValueError as e:
    raise ConfigError(str(e)) from e


def build_task(
  config: ExperimentConfig, task_entry: registry.Entry
) -> tuple[task_lib.Task, dict[str, Any]]:
  """(the task, {path: fingerprint} of the data files its build read)."""
  task_args = config.task_arguments(task_entry.accepts)
  try:
    with paths.recording_data_files() as files:
      task = task_entry.builder(**task_args)
    lacks = task_lib.missing(task)
    if lacks:
      raise ConfigError(
        f'task {config.task!r}: its builder returned a'
        f' {type(task).__name__} without {", ".join(lacks)}'
        ' (tff_comp.task.Task).'
      )
    if config.aggregation.attack == poisoning.KIND:
      flip = config.aggregation.options_of(registry.ATTACKS.get(poisoning.KIND))
      task = poisoning.poisoned_task(task, flip.attack_fraction, config.task_seed)
    return task, files
  except ValueError as e:
    raise ConfigError(f'task {config.task!r}: {e}') from e
  except MemoryError as e:  # NumPy's "Unable to allocate ..." for an absurd size option
    raise ConfigError(
      f'task {config.task!r}: its data do not fit in memory with these options ({e}).'
    ) from e


def _server_optimizer(
  config: ExperimentConfig,
  algorithm: registry.Entry,
  builder_args: dict[str, Any],
  settings_: run_settings.RunSettings,
) -> None:
  """Puts the named server optimizer (at the run's server learning rate) into
  `builder_args`, or raises ConfigError for a setting that cannot apply."""
  if config.server.server_optimizer is None:
    return
  if not algorithm.accepts('server_optimizer'):
    takers = [
      n
      for n in registry.ALGORITHMS.names()
      if registry.get_algorithm(n).accepts('server_optimizer')
    ]
    raise ConfigError(
      f'--server_optimizer: algorithm {config.algorithm!r} runs no server'
      f' optimizer (its server step is its own math); these do:'
      f' {", ".join(takers)}.'
    )
  if builder_args.get('server_momentum'):
    raise ConfigError(
      "--server_momentum and --server_optimizer both choose the server's"
      ' optimizer; for momentum use --server_optimizer=sgdm'
      ' --server_beta_1=MOMENTUM.'
    )
  try:
    builder_args['server_optimizer'] = config.server.build(settings_.server_learning_rate)
  except ValueError as e:
    raise ConfigError(str(e)) from e


def builder_args(
  config: ExperimentConfig,
  algorithm: registry.Entry,
  task: task_lib.Task,
  home: dict[str, Any],
  settings: run_settings.RunSettings,
) -> tuple[dict[str, Any], run_settings.RunSettings]:
  """(the algorithm builder's arguments: home options, given options, common settings,
  the run seed, the population size and the regularizer; `settings` with the
  regularizer in force)."""
  builder_args = {k: v for k, v in home.items() if k not in run_settings.DEFAULTED}
  builder_args.update(config.algorithm_options)
  for name in ('client_learning_rate', 'server_learning_rate', 'batch_size', 'local_epochs'):
    if algorithm.accepts(name):
      builder_args[name] = getattr(settings, name)
    elif config.value(name) is not None:
      raise ConfigError(f'--{name} does not apply to algorithm {config.algorithm!r}.')
  if config.local_work.client_weighting is not None:
    if not algorithm.accepts('client_weighting'):
      raise ConfigError(
        f'--client_weighting does not apply to algorithm'
        f' {config.algorithm!r}, whose math fixes the client weights.'
      )
    builder_args['client_weighting'] = config.local_work.client_weighting
  if algorithm.accepts('seed'):
    builder_args['seed'] = config.seed
  if algorithm.accepts('num_clients'):
    builder_args['num_clients'] = task.num_clients
  _server_optimizer(config, algorithm, builder_args, settings)
  psi = regularizer(config, task, algorithm)
  if psi is not None:
    builder_args['regularizer'] = psi
  return builder_args, dataclasses.replace(
    settings,
    regularizer=psi.name if psi else None,
    regularizer_strength=psi.strength if psi else None,
  )
