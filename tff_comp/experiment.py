"""One experiment = a registered algorithm on a registered task, validated up front.

`ExperimentConfig` holds every setting; `prepare` checks it and builds the task, the
regularizer and the builder arguments without running any TFF computation, raising
`ConfigError` with a one-line message on bad input; `run_experiment` then builds the
process and trains it. Binaries (`binaries/run.py`, `binaries/reproduce.py`) are thin
layers over these two functions.
"""

from collections.abc import Callable, Sequence
import dataclasses
import importlib.metadata
import inspect
import json
import math
import os
import pathlib
import platform
import subprocess
from typing import Any

from tff_comp import accounting
from tff_comp import paths
from tff_comp import privacy as privacy_lib
from tff_comp import registry
from tff_comp import regularizers as regularizers_lib
from tff_comp import schedules as schedules_lib
from tff_comp import server_optimizers
from tff_comp import settings
from tff_comp.ops import aggregation
from tff_comp.ops import algorithm as algorithm_lib
from tff_comp.ops import client_round
from tff_comp.runtime import base as runtime_base
from tff_comp.runtime import inprocess as inprocess_lib
from tff_comp.runtime import simulation
from tff_comp.runtime import workers as workers_lib

# Builder parameters that every run sets from the common flags.
COMMON_ALGORITHM_ARGS = (
    'client_learning_rate', 'server_learning_rate', 'batch_size', 'local_epochs',
    'client_weighting', 'regularizer', 'seed', 'num_clients',
)
# Task parameters fed from common settings rather than task flags.
COMMON_TASK_ARGS = ('seed',)


# 'auto': the first of these registered runtimes that can run the program (in-process
# for every registered algorithm with its own aggregation), else the next.
AUTO_RUNTIMES = ('inprocess', 'tff')
_SPOKEN = {'inprocess': 'in-process'}  # runtime names as the run's header says them
DEFAULT_TASK = 'lasso'
# The run settings `_resolve` fills from the task's (and the home pair's) defaults.
SETTINGS = ('rounds', 'clients_per_round', 'client_learning_rate', 'server_learning_rate',
            'batch_size', 'local_epochs', 'eval_period')


class ConfigError(ValueError):
  """Bad experiment settings; the message is one line for the user."""


def runtime_names() -> list[str]:
  """The --runtime choices: 'auto' and every registered runtime."""
  return ['auto', *registry.RUNTIMES.names()]


@dataclasses.dataclass
class ExperimentConfig:
  """All settings of one run: the run's own below (None: the task's default), and the
  records of the modules that own the rest, each under its name (`GROUPS`).
  `ExperimentConfig.of` takes every setting by its flag's name."""

  algorithm: str
  task: str | None = None  # None: the algorithm's home task (else DEFAULT_TASK)
  rounds: int | None = settings.setting(
      None, 'Training rounds (default: the task\'s).', upper=settings.MAX_COUNT)
  clients_per_round: int | None = settings.setting(
      None, 'Clients sampled per round.', upper=settings.MAX_COUNT)
  client_learning_rate: float | None = settings.setting(None, 'Client learning rate eta_c.')
  server_learning_rate: float | None = settings.setting(None, 'Server learning rate eta_s.')
  batch_size: int | None = settings.setting(None, 'Examples per local step.',
                                            upper=settings.MAX_INT32)
  local_epochs: int | None = settings.setting(
      None, 'Local passes over client data per round.', upper=client_round.MAX_EPOCHS)
  client_weighting: str | None = settings.setting(
      None, 'Weigh clients by examples or uniformly (default: the algorithm\'s).',
      choices=client_round.WEIGHTINGS)
  eval_period: int | None = settings.setting(
      None, 'Evaluate every this many rounds.', upper=settings.MAX_COUNT)
  seed: int = settings.setting(
      0, 'Seed of the run: client sampling and client-side draws.', lower=0,
      upper=settings.MAX_SEED)
  shuffle: bool = settings.setting(
      True, 'Each client visits its examples in a new order every round and epoch (a'
      ' stateless permutation of seed, round, client and epoch); --noshuffle: stored'
      ' order.')
  data_seed: int | None = settings.setting(
      0, 'Seed of the task: generated data, partition and initial model (None: --seed).',
      lower=0, upper=settings.MAX_SEED)
  regularizer: str | None = settings.setting(
      None, 'Regularizer psi (default: the task\'s).',
      choices=lambda: sorted(regularizers_lib.REGULARIZERS))
  regularizer_strength: float | None = settings.setting(
      None, 'Strength lam of psi, or radius of a ball constraint.')
  algorithm_options: dict[str, Any] = dataclasses.field(default_factory=dict)
  task_options: dict[str, Any] = dataclasses.field(default_factory=dict)
  output_dir: str | None = settings.setting(
      None, 'Where metrics go (default runs/<algo>-<task>).')
  overwrite: bool = settings.setting(False, 'Replace a run already in --output_dir.')
  resume: bool = settings.setting(
      False, 'Continue the run in --output_dir from its last checkpoint (its'
      ' configuration must match; --rounds may grow).')
  runtime: str = settings.setting(
      'auto', 'Where rounds run: inprocess (the math in one tf.function per round; fast,'
      ' GPU when TensorFlow sees one), tff (TFF\'s C++ worker), or auto (inprocess where'
      ' the algorithm supports it).', choices=runtime_names)
  participation: simulation.Participation = dataclasses.field(
      default_factory=simulation.Participation)
  schedules: schedules_lib.ScheduleOptions = dataclasses.field(
      default_factory=schedules_lib.ScheduleOptions)
  server: server_optimizers.ServerOptimizerOptions = dataclasses.field(
      default_factory=server_optimizers.ServerOptimizerOptions)
  privacy: privacy_lib.PrivacyOptions = dataclasses.field(
      default_factory=privacy_lib.PrivacyOptions)
  checkpoints: simulation.CheckpointOptions = dataclasses.field(
      default_factory=simulation.CheckpointOptions)
  inprocess: inprocess_lib.InProcessOptions = dataclasses.field(
      default_factory=inprocess_lib.InProcessOptions)
  tff: workers_lib.WorkerOptions = dataclasses.field(
      default_factory=workers_lib.WorkerOptions)

  @classmethod
  def of(cls, **values: Any) -> 'ExperimentConfig':
    """The config from settings by name, flat (`of(algorithm='fedavg', sampling=
    'poisson', clip_norm=1.0, aggregator='clip')`); each goes to the record owning it.

    Raises:
      ConfigError: an unknown name, or a value its record refuses.
    """
    own = {k: v for k, v in values.items() if k not in OWNER}
    unknown = set(own) - {f.name for f in dataclasses.fields(cls)}
    if unknown:
      raise ConfigError(f'unknown settings: {", ".join(sorted(unknown))}.')
    for group, record in GROUPS.items():
      fields = {k: v for k, v in values.items() if OWNER.get(k) == group}
      try:
        own[group] = record(**fields)
      except ValueError as e:
        raise ConfigError(str(e)) from e
    return cls(**own)

  @classmethod
  def from_dict(cls, recorded: dict[str, Any]) -> 'ExperimentConfig':
    """The config a run recorded (config.json; its `resolved` and `environment` and
    other records left aside): rerunning it reproduces the run."""
    names = {f.name for f in dataclasses.fields(cls)}
    values = {k: v for k, v in recorded.items() if k in names and k not in GROUPS}
    for group, record in GROUPS.items():
      values[group] = settings.from_dict(record, recorded.get(group, {}))
    return cls(**values)

  def check(self) -> None:
    """Raises ConfigError for a value outside its choices or bounds."""
    for record in (self, *(getattr(self, group) for group in GROUPS)):
      try:
        settings.check(record)
      except ValueError as e:
        raise ConfigError(str(e)) from e

  @property
  def task_seed(self) -> int:
    return self.seed if self.data_seed is None else self.data_seed


# The records ExperimentConfig collects, by attribute, and which owns each setting.
GROUPS = {f.name: f.type for f in dataclasses.fields(ExperimentConfig)
          if dataclasses.is_dataclass(f.type)}
OWNER = {spec.name: group for group, record in GROUPS.items()
         for spec in settings.specs(record)}


@dataclasses.dataclass
class Prepared:
  """A validated experiment, ready to build its process."""

  config: ExperimentConfig
  task: Any  # tasks.Task
  algorithm: registry.Entry
  builder_args: dict[str, Any]
  settings: dict[str, Any]  # the resolved run settings (after task defaults)
  ledger: accounting.Ledger | None = None  # a DP run's privacy accounting

  def build(self):
    """The registered builder's program: an `ops.algorithm.Algorithm` (a plugin's
    builder may return a TFF LearningProcess)."""
    return self.algorithm.build(self.task.model, **self.builder_args)

  def build_process(self):
    """The program as a TFF LearningProcess (`registry.Entry.process`)."""
    return self.algorithm.process(self.task.model, **self.builder_args)


def _resolve(config: ExperimentConfig, defaults) -> dict[str, Any]:
  fallback = dict(rounds=100, clients_per_round=10, server_learning_rate=1.0,
                  batch_size=10, local_epochs=1, eval_period=10)
  settings = {}
  for key in SETTINGS:
    value = getattr(config, key)
    if value is None:
      value = defaults.get(key, fallback.get(key))
    settings[key] = value
  return settings


def _regularizer(config, task, algorithm) -> regularizers_lib.Regularizer | None:
  chosen = config.regularizer is not None or config.regularizer_strength is not None
  if not algorithm.accepts('regularizer'):
    if chosen:
      raise ConfigError(
          f'--regularizer/--regularizer_strength do not apply to algorithm'
          f' {config.algorithm!r}, which ignores regularizers.'
      )
    return None
  name = config.regularizer or task.regularizer.name
  strength = config.regularizer_strength
  if strength is None:
    strength = task.regularizer.strength
  if strength < 0:
    raise ConfigError(f'--regularizer_strength must be >= 0, got {strength}.')
  try:
    psi = regularizers_lib.make_regularizer(name, strength, task.regularizer_targets)
    psi.check_applies_to(task.weight_shapes)
  except ValueError as e:
    raise ConfigError(f'task {task.name!r} cannot apply this regularizer: {e}') from e
  return psi


def _check_finite(config: ExperimentConfig) -> None:
  """Algorithm and task options are finite numbers (the records check their own)."""
  values = dict(config.algorithm_options)
  values.update({f'{config.task}_{k}': v for k, v in config.task_options.items()})
  for name, value in values.items():
    if isinstance(value, float) and not math.isfinite(value):
      raise ConfigError(f'--{name} must be a finite number, got {value}.')


RUN_FILES = ('metrics.csv', 'config.json', 'tensorboard', 'checkpoints', 'final_model.npz')
# Settings a resumed run may change: where it writes, how long it runs, how it saves,
# and where its rounds run (a run stopped by a dead worker resumes on others; an engine
# that fell back records it).
RESUMABLE_CHANGES = ('output_dir', 'overwrite', 'resume', 'rounds',
                     'checkpoints.checkpoint_every', 'tff.workers', 'runtime_record',
                     'environment', 'inprocess.data_memory_budget')
_RESUMABLE_RESOLVED = ('rounds', 'runtime')


def check_output_dir(output_dir: str | os.PathLike, overwrite: bool = False,
                     resume: bool = False) -> None:
  """Raises ConfigError unless a run can write to `output_dir` without touching
  anything: creates nothing. A directory holding another run (any of `RUN_FILES`) is
  refused unless `overwrite` or `resume` (`check_resumable` then compares the
  configurations)."""
  path = pathlib.Path(output_dir)
  if path.exists() and not path.is_dir():
    raise ConfigError(f'--output_dir={path} is a file, not a directory.')
  if path.is_dir():
    found = [name for name in RUN_FILES if (path / name).exists()]
    if found and not (overwrite or resume):
      raise ConfigError(
          f'--output_dir={path} holds another run ({", ".join(found)}); choose another'
          ' directory, pass --resume to continue it or --overwrite to replace it.')
    existing = path
  else:
    existing = next(p for p in path.absolute().parents if p.exists())
    if not existing.is_dir():
      raise ConfigError(f'--output_dir={path} is under {existing}, which is a file.')
  if not os.access(existing, os.W_OK | os.X_OK):
    raise ConfigError(f'--output_dir={path}: {existing} is not writable.')


def check_resumable(output_dir: pathlib.Path, config: dict[str, Any]) -> None:
  """Raises ConfigError if the run recorded in `output_dir` was configured otherwise
  than `config` (besides `RESUMABLE_CHANGES`). No recorded run: nothing to check."""
  try:
    recorded = json.loads((output_dir / 'config.json').read_text())
  except FileNotFoundError:
    return
  except ValueError as e:
    raise ConfigError(f'--resume: {output_dir / "config.json"} is unreadable ({e}).') from e

  def flat(values, prefix=''):  # {'algorithm_options': {'mu': 1}} -> algorithm_options.mu
    out = {}
    for key, value in values.items():
      out.update(flat(value, f'{prefix}{key}.') if isinstance(value, dict) else
                 {f'{prefix}{key}': value})
    return out

  def comparable(c):  # (settings, resolved settings), flat, less what may change
    c = flat(json.loads(json.dumps(c, default=str)))
    kept = {k: v for k, v in c.items() if not k.startswith('resolved.')
            and not any(k == n or k.startswith(f'{n}.') for n in RESUMABLE_CHANGES)}
    resolved = {k[len('resolved.'):]: v for k, v in c.items() if k.startswith('resolved.')}
    return kept, {k: v for k, v in resolved.items() if k not in _RESUMABLE_RESOLVED}

  (old, old_resolved), (new, new_resolved) = comparable(recorded), comparable(config)
  differ = {}  # name -> (recorded, now); a resolved value over the flag it came from
  for before, after in ((old, new), (old_resolved, new_resolved)):
    for key in sorted(before.keys() | after.keys()):
      if before.get(key) != after.get(key):
        differ[key] = (before.get(key), after.get(key))
  if differ:
    changes = '; '.join(f'{k}: recorded {a!r}, now {b!r}' for k, (a, b) in differ.items())
    raise ConfigError(f'--resume: the run in {output_dir} was configured differently'
                      f' ({changes}); resume it with its own settings or choose another'
                      ' --output_dir.')


def _check_runtime(config: ExperimentConfig) -> None:
  config.check()
  if config.tff.workers and config.runtime not in ('auto', 'tff'):
    raise ConfigError('--workers runs rounds on TFF\'s workers; it goes with'
                      ' --runtime=tff or auto only.')


def _with_names(config: ExperimentConfig,
                algorithm: registry.Entry) -> tuple[ExperimentConfig, registry.Entry]:
  """(config with its task and output directory resolved, the task's entry)."""
  task_name = config.task or algorithm.home_task or DEFAULT_TASK
  config = dataclasses.replace(
      config, task=task_name,
      output_dir=config.output_dir or f'runs/{config.algorithm}-{task_name}')
  return config, registry.get_task(task_name)


def _check_options(config: ExperimentConfig, algorithm: registry.Entry,
                   task_entry: registry.Entry) -> None:
  """Algorithm and task options exist for the chosen pair; numbers finite; the output
  directory usable; run-management settings coherent."""
  known = {h.name for h in algorithm.hparams}
  for name in config.algorithm_options:
    if name not in known or name in COMMON_ALGORITHM_ARGS:
      raise ConfigError(
          f'--{name} does not apply to algorithm {config.algorithm!r}'
          f' (its options: {", ".join(sorted(known - set(COMMON_ALGORITHM_ARGS))) or "none"}).'
      )
  task_known = {h.name for h in task_entry.hparams}
  for name in config.task_options:
    if name not in task_known:
      raise ConfigError(f'task {config.task!r} has no option {name!r}.')
  _check_finite(config)
  check_output_dir(config.output_dir, config.overwrite, config.resume)
  if config.resume and config.overwrite:
    raise ConfigError('--resume continues the run in --output_dir, --overwrite replaces'
                      ' it: choose one.')
  try:
    paths.check_cache_root()
  except ValueError as e:
    raise ConfigError(str(e)) from e


def _build_task(config: ExperimentConfig, task_entry: registry.Entry) -> Any:
  task_args = dict(config.task_options)
  if task_entry.accepts('seed'):
    task_args['seed'] = config.task_seed
  try:
    return task_entry.builder(**task_args)
  except ValueError as e:
    raise ConfigError(f'task {config.task!r}: {e}') from e
  except MemoryError as e:  # NumPy's "Unable to allocate ..." for an absurd size option
    raise ConfigError(f'task {config.task!r}: its data do not fit in memory with these'
                      f' options ({e}).') from e


def _run_settings(config: ExperimentConfig, task, home: dict[str, Any]) -> dict[str, Any]:
  """The run settings (`SETTINGS`) resolved and checked."""
  settings = _resolve(config, {**task.defaults,
                               **{k: v for k, v in home.items() if k in SETTINGS}})
  for name in ('rounds', 'clients_per_round', 'eval_period', 'batch_size', 'local_epochs'):
    if settings[name] is None or settings[name] < 1:
      raise ConfigError(f'--{name} must be >= 1, got {settings[name]}.')
  for name in ('client_learning_rate', 'server_learning_rate'):
    if settings[name] is None or not settings[name] > 0:
      raise ConfigError(f'--{name} must be > 0, got {settings[name]}.')
  if (settings['clients_per_round'] > task.num_clients
      and config.participation.sampling != 'with_replacement'):
    raise ConfigError(
        f'--clients_per_round={settings["clients_per_round"]} exceeds the'
        f' {task.num_clients} clients of task {task.name!r}.'
    )
  return settings


def _server_optimizer(config: ExperimentConfig, algorithm: registry.Entry,
                      builder_args: dict[str, Any], settings_: dict[str, Any]) -> None:
  """Puts the named server optimizer (at the run's server learning rate) into
  `builder_args`, or raises ConfigError for a setting that cannot apply."""
  if config.server.server_optimizer is None:
    return
  if not algorithm.accepts('server_optimizer'):
    takers = [n for n in registry.ALGORITHMS.names()
              if registry.get_algorithm(n).accepts('server_optimizer')]
    raise ConfigError(f'--server_optimizer: algorithm {config.algorithm!r} runs no server'
                      f' optimizer (its server step is its own math); these do:'
                      f' {", ".join(takers)}.')
  if builder_args.get('server_momentum'):
    raise ConfigError('--server_momentum and --server_optimizer both choose the server\'s'
                      ' optimizer; for momentum use --server_optimizer=sgdm'
                      ' --server_beta_1=MOMENTUM.')
  try:
    builder_args['server_optimizer'] = config.server.build(settings_['server_learning_rate'])
  except ValueError as e:
    raise ConfigError(str(e)) from e


def _model_aggregator(config: ExperimentConfig, algorithm: registry.Entry, task,
                      builder_args: dict[str, Any], settings_: dict[str, Any]
                      ) -> privacy_lib.Plan:
  """Puts the --aggregator's `ops.privacy.PrivateMean` into `builder_args` (and the
  resolved noise multiplier and delta into `settings_`); returns its plan. Raises
  ConfigError for settings that cannot apply."""
  options = config.privacy
  if options.aggregator == privacy_lib.MEAN:
    return privacy_lib.Plan(None, None, {})
  if not algorithm.accepts('model_aggregator'):
    raise ConfigError(f'--aggregator: algorithm {config.algorithm!r} takes no model'
                      ' aggregator (its aggregation is its own math).')
  if options.private:
    if config.client_weighting not in (None, 'uniform'):
      raise ConfigError(f'--aggregator={options.aggregator} weighs every client alike'
                        ' (TFF\'s DP semantics): drop --client_weighting or set it to'
                        ' uniform.')
    if algorithm.accepts('client_weighting'):
      builder_args['client_weighting'] = settings_['client_weighting'] = 'uniform'
  try:
    plan = options.plan(
        clients_per_round=settings_['clients_per_round'], population=task.num_clients,
        rounds=settings_['rounds'], sampling=config.participation.sampling,
        recorded_noise_multiplier=(privacy_lib.recorded_noise_multiplier(config.output_dir)
                                   if config.resume else None))
  except ValueError as e:
    raise ConfigError(str(e)) from e
  settings_.update(plan.resolved)
  builder_args['model_aggregator'] = plan.mean
  return plan


def _builder_args(config: ExperimentConfig, algorithm: registry.Entry, task,
                  home: dict[str, Any], settings: dict[str, Any]) -> dict[str, Any]:
  """The algorithm builder's arguments: home options, given options, common settings,
  the run seed, the population size and the regularizer."""
  builder_args = {k: v for k, v in home.items() if k not in SETTINGS}
  builder_args.update(config.algorithm_options)
  for name in ('client_learning_rate', 'server_learning_rate', 'batch_size', 'local_epochs'):
    if algorithm.accepts(name):
      builder_args[name] = settings[name]
    elif getattr(config, name) is not None:
      raise ConfigError(f'--{name} does not apply to algorithm {config.algorithm!r}.')
  if config.client_weighting is not None:
    if not algorithm.accepts('client_weighting'):
      raise ConfigError(f'--client_weighting does not apply to algorithm'
                        f' {config.algorithm!r}, whose math fixes the client weights.')
    builder_args['client_weighting'] = config.client_weighting
  if algorithm.accepts('seed'):
    builder_args['seed'] = config.seed
  if algorithm.accepts('num_clients'):
    builder_args['num_clients'] = task.num_clients
  _server_optimizer(config, algorithm, builder_args, settings)
  psi = _regularizer(config, task, algorithm)
  if psi is not None:
    builder_args['regularizer'] = psi
  settings['regularizer'] = psi.name if psi else None
  settings['regularizer_strength'] = psi.strength if psi else None
  return builder_args


def prepare(config: ExperimentConfig) -> Prepared:
  """Validates `config` and builds the task; runs no TFF computation. Steps: the
  runtime settings, the algorithm and task names, their options, the task, the run
  settings, the builder's arguments.

  Raises:
    registry.RegistryError: unknown algorithm or task.
    ConfigError: any other bad setting.
  """
  _check_runtime(config)
  algorithm = registry.get_algorithm(config.algorithm)
  config, task_entry = _with_names(config, algorithm)
  # Settings and options that work for the (algorithm, home task) pair.
  home = dict(algorithm.home_settings) if config.task == algorithm.home_task else {}
  _check_options(config, algorithm, task_entry)
  task = _build_task(config, task_entry)
  settings = _run_settings(config, task, home)
  builder_args = _builder_args(config, algorithm, task, home, settings)
  plan = _model_aggregator(config, algorithm, task, builder_args, settings)
  prepared = Prepared(config, task, algorithm, builder_args, settings, plan.ledger)
  if config.resume:  # refused before any runtime is built (checked again in `train`)
    check_resumable(pathlib.Path(config.output_dir),
                    dict(dataclasses.asdict(config), resolved=resolved_options(prepared)))
  return prepared


def evaluator(prepared: Prepared, runtime: runtime_base.Runtime
              ) -> Callable[[Any], dict[str, float]]:
  """(state -> the task's metrics): the global model's, and for a runtime with personal
  models (Ditto) each client's own model's, with the run's regularizer.

  Raises:
    ConfigError: the runtime has personal models and the task cannot score them.
  """
  task = prepared.task
  psi = prepared.builder_args.get('regularizer', task.regularizer)
  personalized = runtime.keeps_personal_models
  if personalized and task.evaluate_personal is None:
    raise ConfigError(
        f'algorithm {prepared.config.algorithm!r} trains a personal model per client;'
        f' task {task.name!r} cannot evaluate them (its evaluation clients are not its'
        ' training clients). Try --task=dominant_class.')
  client_ids = task.train_data.client_ids

  def evaluate(state) -> dict[str, float]:
    metrics = task.evaluate(tuple(runtime.get_model_weights(state).trainable), psi)
    if personalized:
      tables = runtime.get_personal_weights(state)
      metrics.update(task.evaluate_personal(
          {cid: tuple(t[i] for t in tables) for i, cid in enumerate(client_ids)}))
    return metrics

  return evaluate


def client_evaluator(prepared: Prepared, runtime: runtime_base.Runtime
                     ) -> Callable[[Any], list[dict]] | None:
  """state -> the task's per-client evaluation rows of the global model (with each
  client's own model's `personal_*` scores for a runtime with personal models), or None
  for a task without per-client evaluation data."""
  task = prepared.task
  if task.evaluate_clients is None:
    return None
  personal = (task.evaluate_personal_clients if runtime.keeps_personal_models else None)
  client_ids = task.train_data.client_ids

  def evaluate_clients(state) -> list[dict]:
    rows = task.evaluate_clients(tuple(runtime.get_model_weights(state).trainable))
    if personal is not None:
      tables = runtime.get_personal_weights(state)
      own = {row['client']: row for row in personal(
          {cid: tuple(t[i] for t in tables) for i, cid in enumerate(client_ids)})}
      rows = [dict(row, **own.get(row['client'], {})) for row in rows]
    return rows

  return evaluate_clients


def runner_for(program, client_data, runtime: str = 'auto', workers: Sequence[str] = (),
               engine: str = 'auto', batch_size: int | None = None,
               client_rounds: int | None = None, data_memory_budget: float | None = None
               ) -> tuple[runtime_base.Runtime, str]:
  """(the runtime running `program` on `client_data`, one line saying which and why).

  `program` is an Algorithm or a LearningProcess. `runtime` names a registered runtime
  (`registry.RUNTIMES`: 'inprocess', 'tff', plugins) or 'auto': the first of
  `AUTO_RUNTIMES` that can run the program ('tff' when `workers` are named), the reason
  for passing over the others in the line. `workers` go to TFF's runtime, `engine` to
  the in-process one, `batch_size` to TFF's for a process taking batched datasets,
  `client_rounds` (the run's rounds x clients per round) to runtimes choosing an engine
  by the run's length, `data_memory_budget` (MB) to runtimes that stream a population
  larger than it.

  Raises:
    ConfigError: the named runtime cannot run the program; the rounds cannot be split
      across workers; a worker does not answer.
  """
  options = {'workers': tuple(workers), 'engine': engine, 'batch_size': batch_size,
             'client_rounds': client_rounds, 'data_memory_budget': data_memory_budget}
  names = AUTO_RUNTIMES if runtime == 'auto' else (runtime,)
  if workers:
    names = ('tff',)
  passed_over = []
  for name in names:
    entry = registry.get_runtime(name)
    try:
      built = entry.build(program, client_data,
                          **{k: v for k, v in options.items() if entry.accepts(k)})
    except runtime_base.UnsupportedError as e:
      if name == names[-1]:
        raise ConfigError(f'--runtime={name}: {e}') from e
      passed_over.append(f'not {_SPOKEN.get(name, name)}: {e}')
      continue
    except (workers_lib.NotMergeableError, workers_lib.WorkerError) as e:
      raise ConfigError(f'--workers: {e}') from e
    why = f' ({"; ".join(passed_over)})' if passed_over else ''
    return built, built.description + why
  raise AssertionError('unreachable: the last runtime returns or raises')


@dataclasses.dataclass
class Runner:
  """A built experiment: the runtime running its rounds (and the line saying which and
  why), and the functions scoring its states."""

  runtime: runtime_base.Runtime
  evaluate: Callable[[Any], dict[str, float]]
  description: str
  algorithm: Any = None  # the ops.algorithm.Algorithm it runs (None: a plugin's process)
  evaluate_clients: Callable[[Any], list[dict]] | None = None  # per-client rows


def _engine(config: ExperimentConfig) -> str:
  """The configured engine; resuming with 'auto', the engine the run used (auto picks by
  the run's length, and a resume may change --rounds: the same engine keeps the
  resumed run bit for bit equal to an uninterrupted one)."""
  if config.resume and config.inprocess.engine == 'auto':
    try:
      recorded = json.loads((pathlib.Path(config.output_dir) / 'config.json').read_text())
      return (recorded.get('runtime_record') or {}).get('engine') or 'auto'
    except (OSError, ValueError, AttributeError):
      pass
  return config.inprocess.engine


def build_runner(prepared: Prepared) -> Runner:
  """Builds the algorithm and places it on the configured runtime (the in-process
  runtime builds no TFF computation).

  Raises:
    ConfigError: the algorithm rejects its arguments, the runtime cannot run it, or the
      task cannot evaluate it.
  """
  config = prepared.config
  try:
    program = prepared.build()
  except ValueError as e:
    raise ConfigError(f'algorithm {config.algorithm!r}: {e}') from e
  if isinstance(program, algorithm_lib.Algorithm):  # the run's seed and local order
    program = program.with_client_options(seed=config.seed, shuffle=config.shuffle)
  algorithm = program if isinstance(program, algorithm_lib.Algorithm) else None
  if (config.participation.sampling == 'with_replacement' and algorithm is not None
      and algorithm.aggregation == aggregation.SLOTS):
    raise ConfigError(f'--sampling=with_replacement: algorithm {config.algorithm!r} keeps'
                      ' a table entry per client, which a client drawn twice would fill'
                      ' twice; use uniform or poisson sampling.')
  settings = prepared.settings
  runtime, description = runner_for(
      program, prepared.task.train_data, config.runtime, config.tff.workers, _engine(config),
      settings['batch_size'], client_rounds=settings['rounds'] * settings['clients_per_round'],
      data_memory_budget=config.inprocess.data_memory_budget)
  if config.participation.straggler_rate > 0 and not getattr(runtime, 'partial_work', False):
    raise ConfigError(f'--straggler_rate: the {runtime.name} runtime cannot run clients'
                      ' doing part of their local steps; use --runtime=inprocess.')
  return Runner(runtime, evaluator(prepared, runtime), description, algorithm,
                client_evaluator(prepared, runtime))


def resolved_options(prepared: Prepared) -> dict[str, Any]:
  """The run settings and every algorithm and task option in force, defaults included
  (what config.json's `resolved` records)."""

  def in_force(entry: registry.Entry, given: dict[str, Any], skip) -> dict[str, Any]:
    return {h.name: given.get(h.name, h.default) for h in entry.hparams
            if h.name not in skip and h.default is not inspect.Parameter.empty}

  return dict(
      prepared.settings,
      algorithm_options=in_force(prepared.algorithm, prepared.builder_args,
                                 COMMON_ALGORITHM_ARGS),
      task_options=in_force(registry.get_task(prepared.config.task),
                            prepared.config.task_options, COMMON_TASK_ARGS))


def environment() -> dict[str, Any]:
  """Versions of what ran (tff_comp, TensorFlow, TFF, NumPy, Python) and, run from a
  git checkout, its commit and whether the tree had uncommitted changes."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

  record = {'tff_comp': importlib.metadata.version('tff_comp'), 'tensorflow': tf.__version__,
            'tensorflow_federated': tff.__version__, 'numpy': np.__version__,
            'python': platform.python_version()}
  checkout = pathlib.Path(__file__).resolve().parent.parent
  if (checkout / '.git').exists():
    def git(*args):
      return subprocess.run(['git', '-C', str(checkout), *args], capture_output=True,
                            text=True, timeout=30, check=False).stdout.strip()
    record['git_commit'] = git('rev-parse', 'HEAD')
    record['git_dirty'] = bool(git('status', '--porcelain', '--untracked-files=no'))
  return record


def train(prepared: Prepared, runner: Runner, *, show_progress: bool = True,
          learning_rates: tuple[float, float] | None = None,
          client_hparams: dict[str, float] | None = None,
          output_dir: str | None = None,
          extra_config: dict[str, Any] | None = None) -> dict[str, float]:
  """Trains `runner` (built once, reusable: a grid sets `learning_rates`, and the client
  work's other hparams by name in `client_hparams`, through the process's hparams) into
  `output_dir` (default the config's); returns the final evaluation metrics.
  `extra_config` is recorded in config.json beside the config."""
  prepared.settings['runtime'] = runner.description
  if show_progress:
    print(f'runtime: {runner.description}', flush=True)
  client_hparams = dict(client_hparams or {})
  if client_hparams and learning_rates is None:
    raise ValueError('client_hparams are set together with learning_rates.')
  resolved = resolved_options(prepared)
  resolved['algorithm_options'].update(  # the values in force, not the build's
      {k: v for k, v in client_hparams.items() if k in resolved['algorithm_options']})
  config = dict(dataclasses.asdict(prepared.config), resolved=resolved,
                environment=environment(), **(extra_config or {}))
  output_dir = output_dir or prepared.config.output_dir
  check_output_dir(output_dir, prepared.config.overwrite, prepared.config.resume)
  try:
    with simulation.output_lock(pathlib.Path(output_dir)):
      # Checked again under the lock: a run started beside this one may have written.
      check_output_dir(output_dir, prepared.config.overwrite, prepared.config.resume)
      return _train_locked(prepared, runner, config, output_dir, show_progress,
                           learning_rates, client_hparams)
  except simulation.OutputDirInUse as e:
    raise ConfigError(str(e)) from e


def _train_locked(prepared: Prepared, runner: Runner, config: dict[str, Any],
                  output_dir: str, show_progress: bool,
                  learning_rates: tuple[float, float] | None,
                  client_hparams: dict[str, float]) -> dict[str, float]:
  if prepared.config.resume:
    check_resumable(pathlib.Path(output_dir), config)
  if not prepared.config.schedules.pair()[1].constant:
    runtime = runner.runtime
    if 'learning_rate' not in runtime.get_hparams(runtime.initialize())['finalizer']:
      raise ConfigError(f'--server_lr_schedule: algorithm {prepared.config.algorithm!r}'
                        ' has no server learning rate to schedule.')
  if learning_rates is not None and runner.algorithm is not None:
    hparams = dict(runner.algorithm.client_rule.initial_hparams(), **client_hparams,
                   learning_rate=learning_rates[0])
    try:
      runner.algorithm.client_rule.check_hparams(hparams)
    except ValueError as e:
      raise ConfigError(f'algorithm {prepared.config.algorithm!r}: {e}') from e
  return simulation.run_simulation(
      runner.runtime,
      client_ids=prepared.task.train_data.client_ids,
      evaluate=runner.evaluate,
      evaluate_clients=runner.evaluate_clients,
      rounds=prepared.settings['rounds'],
      clients_per_round=prepared.settings['clients_per_round'],
      seed=prepared.config.seed,
      eval_period=prepared.settings['eval_period'],
      output_dir=pathlib.Path(output_dir),
      config=config,
      show_progress=show_progress,
      learning_rates=learning_rates,
      client_hparams=client_hparams,
      schedules=prepared.config.schedules.pair(),
      divergence_hint=prepared.algorithm.divergence_hint,
      checkpoint_every=prepared.config.checkpoints.checkpoint_every,
      resume=prepared.config.resume,
      participation=prepared.config.participation,
      callbacks=prepared.config.privacy.callbacks(
          prepared.ledger, prepared.settings['rounds'], prepared.settings['eval_period'],
          show_progress),
  )


def run_experiment(prepared: Prepared, *, show_progress: bool = True) -> dict[str, float]:
  """Builds the process, places it on the configured runtime and trains it; returns
  the final evaluation metrics."""
  return train(prepared, build_runner(prepared), show_progress=show_progress)
