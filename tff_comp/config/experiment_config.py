"""The settings of one run: `ExperimentConfig` collects the run's own (None: the task's
default) and the records of the modules that own the rest (`tff_comp.settings`)."""

from collections.abc import Callable, Iterable, Mapping
import dataclasses
import difflib
from typing import Any

from tff_comp import registry, server_optimizers, settings
from tff_comp import schedules as schedules_lib
from tff_comp.config import aggregation_settings, builder_options, client_settings, privacy_settings
from tff_comp.ops import regularizers as regularizers_lib
from tff_comp.run import buffered_async
from tff_comp.run import checkpoints as checkpoints_lib
from tff_comp.run import devices as devices_lib
from tff_comp.run import sampling as sampling_lib
from tff_comp.runtime import choice
from tff_comp.settings import ConfigError

DEFAULT_TASK = 'lasso'  # the task of an algorithm without a home task


def task_of(algorithm: str, task: str | None) -> str:
  """The task a run of the registered `algorithm` trains: `task`, else the algorithm's
  home task, else DEFAULT_TASK."""
  return task or registry.get_algorithm(algorithm).home_task or DEFAULT_TASK


def runtime_names() -> list[str]:
  """The --runtime choices: 'auto' and every registered runtime."""
  return ['auto', *registry.RUNTIMES.names()]


def unknown_settings(unknown: Iterable[str], known: Iterable[str]) -> ConfigError:
  """The error naming `unknown` settings, each with its nearest `known` name if one is
  close (`byzantine` -> `byzantine_clients`, as absl suggests for a misspelt flag)."""
  known = sorted(known)
  named = []
  for name in sorted(unknown):
    close = difflib.get_close_matches(name, known, n=1)
    named.append(f'{name} (did you mean {close[0]}?)' if close else name)
  return ConfigError(f'unknown settings: {", ".join(named)}.')


@dataclasses.dataclass(frozen=True)
class ExperimentConfig:
  """All settings of one run: the run's own below (None: the task's default), and the
  records of the modules that own the rest, each under its name (`GROUPS`).
  `ExperimentConfig.of` takes every setting by its flag's name. Frozen, as its records:
  a changed run is `dataclasses.replace`'s copy."""

  algorithm: str
  task: str | None = None  # None: the algorithm's home task (else DEFAULT_TASK)
  rounds: int | None = settings.setting(
    None,
    "Training rounds (default: the task's).",
    upper=settings.MAX_COUNT,
    resumable=True,
    per_trial=True,
  )
  clients_per_round: int | None = settings.setting(
    None, 'Clients sampled per round.', upper=settings.MAX_COUNT, per_trial=True
  )
  server_learning_rate: float | None = settings.setting(
    None, 'Server learning rate eta_s.', per_trial=True
  )
  eval_period: int | None = settings.setting(
    None, 'Evaluate every this many rounds.', upper=settings.MAX_COUNT, per_trial=True
  )
  seed: int = settings.setting(
    0,
    'Seed of the run: client sampling and client-side draws.',
    lower=0,
    upper=settings.MAX_SEED,
    per_trial=True,
  )
  data_seed: int | None = settings.setting(
    0,
    'Seed of the task: generated data, partition and initial model (None: --seed).',
    lower=0,
    upper=settings.MAX_SEED,
  )
  model: str | None = settings.setting(
    None,
    "The task's model by name, for tasks with a model option (emnist, cifar100:"
    " a built-in name or a model plugin's, registry.register_model); as"
    ' --<task>_model.',
  )
  regularizer: str | None = settings.setting(
    None,
    "Regularizer psi (default: the task's).",
    choices=lambda: sorted(regularizers_lib.REGULARIZERS),
  )
  regularizer_strength: float | None = settings.setting(
    None, 'Strength lam of psi, or radius of a ball constraint.'
  )
  # The algorithm builder's and the task builder's options (flags --<name> and
  # --<task>_<name>): given as a mapping {name: value}, held as the builder's typed
  # record (`builder_options`: `config.algorithm_options.mu`, None where not given).
  algorithm_options: builder_options.BuilderOptions = dataclasses.field(
    default_factory=builder_options.BuilderOptions
  )
  task_options: builder_options.BuilderOptions = dataclasses.field(
    default_factory=builder_options.BuilderOptions
  )
  output_dir: str | None = settings.setting(
    None, 'Where metrics go (default runs/<algo>-<task>).', resumable=True, per_trial=True
  )
  overwrite: bool = settings.setting(
    False, 'Replace a run already in --output_dir.', resumable=True, per_trial=True
  )
  resume: bool = settings.setting(
    False,
    'Continue the run in --output_dir from its last checkpoint (its'
    ' configuration must match; --rounds may grow).',
    resumable=True,
    per_trial=True,
  )
  force_resume: bool = settings.setting(
    False,
    'With --resume: continue a run whose config.json is gone, with these'
    " settings (they cannot be checked against the run's).",
    resumable=True,
    per_trial=True,
  )
  runtime: str = settings.setting(
    'auto',
    'Where rounds run: inprocess (the math in one tf.function per round; fast,'
    " GPU when TensorFlow sees one), tff (TFF's C++ worker), ray (the in-process math"
    " with each round's clients on Ray actors; --ray_address), or auto (inprocess where"
    ' the algorithm supports it).',
    choices=runtime_names,
  )
  local_work: client_settings.LocalWorkOptions = dataclasses.field(
    default_factory=client_settings.LocalWorkOptions
  )
  participation: sampling_lib.Participation = dataclasses.field(
    default_factory=sampling_lib.Participation
  )
  devices: devices_lib.DeviceOptions = dataclasses.field(default_factory=devices_lib.DeviceOptions)
  asynchrony: buffered_async.AsyncOptions = dataclasses.field(
    default_factory=buffered_async.AsyncOptions
  )
  schedules: schedules_lib.ScheduleOptions = dataclasses.field(
    default_factory=schedules_lib.ScheduleOptions
  )
  server: server_optimizers.ServerOptimizerOptions = dataclasses.field(
    default_factory=server_optimizers.ServerOptimizerOptions
  )
  privacy: privacy_settings.PrivacyOptions = dataclasses.field(
    default_factory=privacy_settings.PrivacyOptions
  )
  aggregation: aggregation_settings.AggregationOptions = dataclasses.field(
    default_factory=aggregation_settings.AggregationOptions
  )
  checkpoints: checkpoints_lib.CheckpointOptions = dataclasses.field(
    default_factory=checkpoints_lib.CheckpointOptions
  )
  # {runtime: its settings record} for every registered runtime declaring one
  # (`runtime.choice.runtime_options`): 'inprocess' (engine, memory budget), 'tff'
  # (workers), 'ray' (address, actors), a plugin's.
  runtime_options: Mapping[str, Any] = dataclasses.field(default_factory=choice.runtime_options)

  def __post_init__(self):
    # The options as their builders' records (typed, checked); the runtimes' mapping
    # cannot change either (`settings.Options`).
    for name, kind, builder in (
      ('algorithm_options', 'algorithm', self.algorithm),
      ('task_options', 'task', self.task_name),
    ):
      object.__setattr__(self, name, builder_options.of(kind, builder, getattr(self, name)))
    object.__setattr__(self, 'runtime_options', settings.Options(self.runtime_options))
    # The privacy settings against the mechanism --aggregator (the aggregation's) names.
    try:
      self.privacy.check(self.aggregation.aggregator)
    except ValueError as e:
      raise ConfigError(str(e)) from e

  @classmethod
  def of(cls, **values: Any) -> 'ExperimentConfig':
    """The config from settings by name, flat (`of(algorithm='fedavg', sampling=
    'poisson', clip_norm=1.0, aggregator='clip')`); each goes to the record owning it.

    Raises:
      ConfigError: an unknown name, or a value its record refuses.
    """
    # A NumPy scalar as Python's (config.json records JSON's numbers, not their str).
    values = {
      k: v.item() if type(v).__module__ == 'numpy' and getattr(v, 'ndim', None) == 0 else v
      for k, v in values.items()
    }
    runtime_owner = choice.setting_owners()
    own = {k: v for k, v in values.items() if k not in OWNER and k not in runtime_owner}
    unknown = set(own) - {f.name for f in dataclasses.fields(cls)}
    if unknown:
      raise unknown_settings(unknown, setting_names())
    runtime_values = {k: v for k, v in values.items() if k in runtime_owner}
    if 'runtime_options' in own and runtime_values:
      raise ConfigError(
        f'{", ".join(sorted(runtime_values))} and runtime_options= both set'
        ' runtime settings: give one.'
      )
    own['runtime_options'] = choice.runtime_options(own.get('runtime_options'), **runtime_values)
    for group, record in GROUPS.items():
      fields = {k: v for k, v in values.items() if OWNER.get(k) == group}
      if group in own:  # the record given whole
        if fields:
          raise ConfigError(f'{", ".join(sorted(fields))} and {group}= both set {group}: give one.')
        continue
      try:
        own[group] = record(**fields)
      except ValueError as e:
        raise ConfigError(str(e)) from e
    return cls(**own)

  @classmethod
  def from_dict(cls, recorded: dict[str, Any]) -> 'ExperimentConfig':
    """The config a run recorded (config.json; its `resolved` and `environment` and
    other records left aside): rerunning it reproduces the run."""
    recorded = upgrade(recorded)
    names = {f.name for f in dataclasses.fields(cls)}
    values = {k: v for k, v in recorded.items() if k in names and k not in GROUPS}
    for group, record in GROUPS.items():
      values[group] = settings.from_dict(record, recorded.get(group, {}))
    values['runtime_options'] = choice.runtime_options(recorded.get('runtime_options'))
    return cls(**values)

  def check(self) -> None:
    """Raises ConfigError for a value outside its choices or bounds, or a setting the
    run would ignore (`settings.setting(applies_when=...)`)."""
    for record in (self, *(getattr(self, group) for group in GROUPS)):
      try:
        settings.check(record)
      except ValueError as e:
        raise ConfigError(str(e)) from e
      ignored = settings.ignored_settings(record, self.value)
      if ignored:
        raise ConfigError(ignored)
    choice.check(self.runtime, self.runtime_options)
    if self.force_resume and not self.resume:
      raise ConfigError('--force_resume goes with --resume.')

  def input_files(self) -> list[str]:
    """The paths of the files its settings name as inputs (`settings.input_files`), and
    a model's file (`--model=path/to/file.py:function`)."""
    named = [
      path
      for record in (self, *(getattr(self, group) for group in GROUPS))
      for path in settings.input_files(record)
    ]
    model = self.model or self.task_options.get('model')
    if isinstance(model, str) and model.rpartition(':')[0].endswith('.py'):
      named.append(model.rpartition(':')[0])
    return named

  def value(self, name: str) -> Any:
    """A setting by its flag's name, from this config or the record owning it."""
    return getattr(getattr(self, OWNER[name]) if name in OWNER else self, name)

  def task_arguments(self, accepts: Callable[[str], bool]) -> dict[str, Any]:
    """The task builder's arguments (`accepts`: whether it takes a parameter): its
    options, the task seed, and `model` for the builder's `model` option.

    Raises:
      ConfigError: `--model` for a task without a model option, or beside a different
        `--<task>_model`.
    """
    args = dict(self.task_options)
    if accepts('seed'):
      args['seed'] = self.task_seed
    if self.model is not None:
      if not accepts('model'):
        raise ConfigError(f'--model: task {self.task!r} has no model option.')
      if args.get('model', self.model) != self.model:
        raise ConfigError(
          f'--model={self.model} and --{self.task}_model={args["model"]} disagree: give one.'
        )
      args['model'] = self.model
    return args

  @property
  def task_name(self) -> str:
    """The task the run trains (`task_of`)."""
    return task_of(self.algorithm, self.task)

  @property
  def task_seed(self) -> int:
    return self.seed if self.data_seed is None else self.data_seed


def declared(attribute: str) -> tuple[str, ...]:
  """The config.json names (`rounds`, `checkpoints.checkpoint_every`,
  `runtime_options.tff.workers`) of the settings declared with `attribute` true
  (`settings.setting`'s `resumable` or `per_trial`), registered runtimes' included."""
  records = {
    '': ExperimentConfig,
    **{f'{group}.': record for group, record in GROUPS.items()},
    **{
      f'runtime_options.{name}.': type(record) for name, record in choice.runtime_options().items()
    },
  }
  return tuple(
    f'{prefix}{spec.name}'
    for prefix, record in records.items()
    for spec in settings.specs(record)
    if getattr(spec, attribute)
  )


def upgrade(recorded: dict[str, Any]) -> dict[str, Any]:
  """A config.json of an earlier layout in today's: settings recorded at the top level
  that a record now owns (0.3.0's client settings, now `local_work`) moved into it, and
  a record added since (`devices`, `asynchrony`) at its defaults, which that run ran
  with; a setting moved from one record to another (0.3.0's `--aggregator`, from
  `privacy` to `aggregation`) moved along."""
  moved = {k: v for k, v in recorded.items() if k in OWNER and OWNER[k] not in recorded}
  upgraded = {k: v for k, v in recorded.items() if k not in moved}
  for name, value in moved.items():
    upgraded.setdefault(OWNER[name], {})[name] = value
  for group in GROUPS:
    held = upgraded.get(group)
    if not isinstance(held, dict):
      continue
    strays = {k: v for k, v in held.items() if k in OWNER and OWNER[k] != group}
    if strays:
      upgraded[group] = {k: v for k, v in held.items() if k not in strays}
      for name, value in strays.items():
        upgraded[OWNER[name]] = {**upgraded.get(OWNER[name], {}), name: value}
  for group, record in GROUPS.items():
    if group not in upgraded:
      upgraded[group] = dataclasses.asdict(record())
  return upgraded


# The records ExperimentConfig collects, by attribute, and which owns each setting.
GROUPS: dict[str, type] = {
  f.name: f.type
  for f in dataclasses.fields(ExperimentConfig)
  if isinstance(f.type, type) and dataclasses.is_dataclass(f.type)
}
OWNER = {spec.name: group for group, record in GROUPS.items() for spec in settings.specs(record)}


def setting_names() -> set[str]:
  """Every name `ExperimentConfig.of` takes: the config's fields, its records' settings
  and the registered runtimes'."""
  return (
    {f.name for f in dataclasses.fields(ExperimentConfig)}
    | set(OWNER)
    | set(choice.setting_owners())
  )
