"""A run's configuration validated and its task built: `prepare` -> `Prepared`.

`prepare` checks an `ExperimentConfig` and builds the task, the regularizer and the
builder's arguments without running any TFF computation, raising `ConfigError` with a
one-line message on bad input; `tff_comp.experiment` builds and trains what it returns.
"""

from collections.abc import Mapping
import dataclasses
import inspect
import pathlib
from typing import Any

from tff_comp import accounting, registry
from tff_comp import task as task_lib
from tff_comp.config import (
  build_arguments,
  builder_options,
  privacy_settings,
  run_directory,
  run_settings,
)
from tff_comp.config.experiment_config import ExperimentConfig
from tff_comp.run import devices, sampling
from tff_comp.settings import ConfigError


@dataclasses.dataclass
class Prepared:
  """A validated experiment, ready to build its process."""

  config: ExperimentConfig
  task: task_lib.Task
  algorithm: registry.Entry
  builder_args: dict[str, Any]
  settings: run_settings.RunSettings  # the run's settings in force
  ledger: accounting.Ledger | None = None  # a DP run's privacy accounting
  # {path: fingerprint} of the data files the task's build read, and of every file the
  # run reads (those and the files its settings name: a device trace), config.json's
  # environment.data_files.
  task_files: dict[str, Any] = dataclasses.field(default_factory=dict)
  inputs: dict[str, Any] = dataclasses.field(default_factory=dict)

  @property
  def output_dir(self) -> str:
    """The run's output directory (`prepare` resolves it: runs/<algo>-<task> by
    default)."""
    assert self.config.output_dir is not None, 'resolved by prepare'
    return self.config.output_dir

  @property
  def task_name(self) -> str:
    """The registered task's name (`prepare` resolves it: the algorithm's home task by
    default)."""
    assert self.config.task is not None, 'resolved by prepare'
    return self.config.task

  def build(self):
    """The registered builder's program: an `ops.algorithm.Algorithm` (a plugin's
    builder may return a TFF LearningProcess)."""
    return self.algorithm.build(self.task.model, **self.builder_args)

  def build_process(self):
    """The program as a TFF LearningProcess (`registry.Entry.process`)."""
    return self.algorithm.process(self.task.model, **self.builder_args)


def prepare(config: ExperimentConfig, *, like: Prepared | None = None) -> Prepared:
  """Validates `config` and builds the task; runs no TFF computation. Steps: the
  runtime settings, the task's name, the run directory, the task, the run settings, the
  builder's arguments (the options were checked with the config, `builder_options`).
  `like`: a run prepared from the same task settings (the trials of a grid), whose task
  this one shares instead of building it again.

  Raises:
    registry.RegistryError: unknown algorithm or task.
    ConfigError: any other bad setting.
  """
  config.check()
  algorithm = registry.get_algorithm(config.algorithm)
  config, task_entry = build_arguments.with_names(config)
  # Settings and options that work for the (algorithm, home task) pair.
  home = dict(algorithm.home_settings) if config.task == algorithm.home_task else {}
  build_arguments.check_run_directory(config)
  task, task_files = (
    (like.task, like.task_files)
    if like is not None
    else build_arguments.build_task(config, task_entry)
  )
  settings = run_settings.resolve(
    config.value, task, home, with_replacement=config.participation.sampling == 'with_replacement'
  )
  builder_args, settings = build_arguments.builder_args(config, algorithm, task, home, settings)
  plan = privacy_settings.configure(
    config.privacy,
    config.aggregation,
    algorithm,
    rounds=settings.rounds,
    clients_per_round=settings.clients_per_round,
    client_weighting=config.local_work.client_weighting,
    population=task.num_clients,
    sampling=config.participation.sampling,
    resuming=config.output_dir if config.resume else None,
    min_separation=config.participation.min_separation,
  )
  settings = dataclasses.replace(settings, **plan.resolved)
  builder_args = {**builder_args, **plan.arguments}
  if config.devices.device_model != 'none' and config.participation.sampling == 'cyclic':
    raise ConfigError(
      '--sampling=cyclic takes fixed blocks of clients in turn, which --device_model'
      " (the clients available at a round's time) would break."
    )
  if config.devices.device_model != 'none' and config.participation.separated:
    raise ConfigError(
      '--min_separation draws among the clients recent rounds did not sample, which'
      " --device_model (the clients available at a round's time) would break."
    )
  try:
    sampling.check_population(config.participation, settings.clients_per_round, task.num_clients)
  except ValueError as e:
    raise ConfigError(str(e)) from e
  trace = config.devices.device_trace
  if config.devices.device_model == 'trace' and trace is not None:  # `check` requires it
    try:  # read before the run locks its directory
      devices.read_trace(pathlib.Path(trace), task.train_data.client_ids)
    except ValueError as e:
      raise ConfigError(str(e)) from e
  prepared = Prepared(
    config,
    task,
    algorithm,
    builder_args,
    settings,
    plan.ledger,
    task_files,
    run_directory.input_files(config.input_files(), task_files),
  )
  if config.resume:  # refused before any runtime is built (checked again in `train_runner`,
    # with what its caller adds to config.json)
    run_directory.check_resumable(
      pathlib.Path(prepared.output_dir),
      dict(dataclasses.asdict(config), resolved=resolved_options(prepared)),
      force=config.force_resume,
      extra_later=True,
      inputs=prepared.inputs,
    )
  return prepared


def resolved_options(prepared: Prepared, runtime: str | None = None) -> dict[str, Any]:
  """The run settings and every algorithm and task option in force, defaults included,
  and the `runtime`'s description where known (what config.json's `resolved` records)."""

  def in_force(options: builder_options.BuilderOptions, given: Mapping[str, Any]) -> dict[str, Any]:
    """Each of `options`' record's options with a default: its value in `given`, else
    that default."""
    return {
      name: given.get(name, h.default)
      for name, h in options.hparams.items()
      if h.default is not inspect.Parameter.empty
    }

  config = prepared.config
  return dict(
    prepared.settings.record(),
    **({} if runtime is None else {'runtime': runtime}),
    # The algorithm's given, home settings and the run's arguments all in builder_args.
    algorithm_options=in_force(config.algorithm_options, prepared.builder_args),
    task_options=dict(
      in_force(config.task_options, config.task_options),
      # A plugin's task (the `task.Task` protocol) need not say what it resolved.
      **getattr(prepared.task, 'resolved_options', {}),
    ),
  )
