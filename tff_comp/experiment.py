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
from tff_comp import registry
from tff_comp import regularizers as regularizers_lib
from tff_comp import schedules as schedules_lib
from tff_comp import server_optimizers
from tff_comp.ops import aggregation
from tff_comp.ops import algorithm as algorithm_lib
from tff_comp.ops import privacy
from tff_comp.runtime import base as runtime_base
from tff_comp.runtime import inprocess
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


@dataclasses.dataclass
class ExperimentConfig:
  """All settings of one run. None means: the task's default."""

  algorithm: str
  task: str | None = None  # None: the algorithm's home task (else DEFAULT_TASK)
  rounds: int | None = None
  clients_per_round: int | None = None
  client_learning_rate: float | None = None
  server_learning_rate: float | None = None
  batch_size: int | None = None
  local_epochs: int | None = None
  client_weighting: str | None = None
  eval_period: int | None = None
  seed: int = 0  # the run: client sampling and client-side draws
  shuffle: bool = True  # each epoch in its own order (ClientOptions.shuffle)
  sampling: str = 'uniform'  # how clients are drawn (simulation.Participation)
  dropout_rate: float = 0.0  # a sampled client fails to report
  straggler_rate: float = 0.0  # a reporting client does part of its local steps
  straggler_work: float = 0.5  # the part a straggler does
  data_seed: int | None = 0  # the task: generated data, partition, initial model; None: seed
  regularizer: str | None = None
  regularizer_strength: float | None = None
  # The server's optimizer by name (server_optimizers.NAMES; None: the algorithm's own)
  # and its hyperparameters (None: server_optimizers.build's defaults).
  server_optimizer: str | None = None
  server_beta_1: float | None = None
  server_beta_2: float | None = None
  server_epsilon: float | None = None
  # Learning-rate schedules over rounds (schedules.NAMES) and their parameters.
  client_lr_schedule: str = 'constant'
  server_lr_schedule: str = 'constant'
  lr_decay_rate: float = 0.5
  lr_decay_rounds: int = 100
  lr_warmup_rounds: int = 10
  # What averages the model delta: 'mean' (the algorithm's own aggregation), or
  # ops.privacy.KINDS: clipping to clip_norm, DP with Gaussian noise (noise_multiplier,
  # or calibrated to target_epsilon over the rounds; both: fixed noise, the run stops
  # when target_epsilon is spent), adaptive clipping from clip_norm to clip_quantile.
  aggregator: str = 'mean'
  clip_norm: float | None = None
  noise_multiplier: float | None = None
  target_epsilon: float | None = None
  target_delta: float | None = None  # None: accounting.default_delta(population)
  clip_quantile: float = 0.5
  clip_learning_rate: float = 0.2
  clipped_count_stddev: float | None = None  # None: TFF's 0.05 x clients_per_round
  accountant: str = 'rdp'  # accounting.ACCOUNTANTS
  algorithm_options: dict[str, Any] = dataclasses.field(default_factory=dict)
  task_options: dict[str, Any] = dataclasses.field(default_factory=dict)
  output_dir: str | None = None  # None: runs/<algorithm>-<task>
  runtime: str = 'auto'  # a registered runtime (registry.RUNTIMES) or 'auto'
  engine: str = 'auto'  # the in-process runtime's engine (runtime.engines)
  workers: tuple[str, ...] = ()  # host:port of TFF workers splitting each round's clients
  overwrite: bool = False  # replace a run already in output_dir
  resume: bool = False  # continue the run in output_dir from its last checkpoint
  checkpoint_every: int = 50  # rounds between saved process states
  # MB the clients' examples may take resident in-process; a larger population streams
  # each round's cohort (runtime.streaming).
  data_memory_budget: float = 4096.0

  @property
  def participation(self) -> simulation.Participation:
    """Sampling and availability (raises ValueError for bad values)."""
    return simulation.Participation(self.sampling, self.dropout_rate, self.straggler_rate,
                                    self.straggler_work)

  @property
  def schedules(self) -> tuple[schedules_lib.Schedule, schedules_lib.Schedule]:
    """The (client, server) learning-rate schedules (raises ValueError for bad values)."""
    return tuple(schedules_lib.Schedule(name, self.lr_decay_rate, self.lr_decay_rounds,
                                        self.lr_warmup_rounds)
                 for name in (self.client_lr_schedule, self.server_lr_schedule))

  @property
  def task_seed(self) -> int:
    return self.seed if self.data_seed is None else self.data_seed


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
  """Every float setting is a finite number (inf or nan would only surface rounds later,
  as a misleading divergence)."""
  values = {name: getattr(config, name) for name in (
      'client_learning_rate', 'server_learning_rate', 'regularizer_strength',
      'server_beta_1', 'server_beta_2', 'server_epsilon', 'lr_decay_rate', 'clip_norm',
      'noise_multiplier', 'target_epsilon', 'target_delta', 'clip_quantile', 'clip_learning_rate',
      'clipped_count_stddev')}
  values.update(config.algorithm_options)
  values.update({f'{config.task}_{k}': v for k, v in config.task_options.items()})
  for name, value in values.items():
    if isinstance(value, float) and not math.isfinite(value):
      raise ConfigError(f'--{name} must be a finite number, got {value}.')


RUN_FILES = ('metrics.csv', 'config.json', 'tensorboard', 'checkpoints', 'final_model.npz')
# Settings a resumed run may change: where it writes, how long it runs, how it saves,
# and where its rounds run (a run stopped by a dead worker resumes on others; an engine
# that fell back records it).
RESUMABLE_CHANGES = ('output_dir', 'overwrite', 'resume', 'rounds', 'checkpoint_every',
                     'workers', 'runtime_record', 'environment', 'data_memory_budget')
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

  def comparable(c):
    c = {k: v for k, v in c.items() if k not in RESUMABLE_CHANGES}
    c['resolved'] = {k: v for k, v in c.get('resolved', {}).items()
                     if k not in _RESUMABLE_RESOLVED}
    return json.loads(json.dumps(c, default=str))

  def flat(settings, prefix=''):  # {'algorithm_options': {'mu': 1}} -> algorithm_options.mu
    out = {}
    for key, value in settings.items():
      out.update(flat(value, f'{prefix}{key}.') if isinstance(value, dict) else
                 {f'{prefix}{key}': value})
    return out

  old, new = comparable(recorded), comparable(config)
  old_resolved, new_resolved = flat(old.pop('resolved')), flat(new.pop('resolved'))
  differ = {}  # name -> (recorded, now); a resolved value over the flag it came from
  for before, after in ((flat(old), flat(new)), (old_resolved, new_resolved)):
    for key in sorted(before.keys() | after.keys()):
      if before.get(key) != after.get(key):
        differ[key] = (before.get(key), after.get(key))
  if differ:
    changes = '; '.join(f'{k}: recorded {a!r}, now {b!r}' for k, (a, b) in differ.items())
    raise ConfigError(f'--resume: the run in {output_dir} was configured differently'
                      f' ({changes}); resume it with its own settings or choose another'
                      ' --output_dir.')


def runtime_names() -> list[str]:
  """The --runtime choices: 'auto' and every registered runtime."""
  return ['auto', *registry.RUNTIMES.names()]


def _check_runtime(config: ExperimentConfig) -> None:
  if config.runtime not in runtime_names():
    raise ConfigError(f'--runtime={config.runtime!r} is unknown; choose one of'
                      f' {", ".join(runtime_names())}.')
  if config.engine not in inprocess.ENGINES:
    raise ConfigError(f'--engine={config.engine!r} is unknown; choose one of'
                      f' {", ".join(inprocess.ENGINES)}.')
  if config.workers and config.runtime not in ('auto', 'tff'):
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
  for name in ('seed', 'data_seed'):
    value = getattr(config, name)
    if value is not None and not 0 <= value < 2**32:
      raise ConfigError(f'--{name} must be in [0, 2^32), got {value}.')
  if not config.data_memory_budget >= 0:
    raise ConfigError(f'--data_memory_budget must be >= 0 (MB), got'
                      f' {config.data_memory_budget}.')
  if not config.checkpoint_every >= 1:
    raise ConfigError(f'--checkpoint_every must be >= 1, got {config.checkpoint_every}.')
  try:
    config.participation  # pylint: disable=pointless-statement
  except ValueError as e:
    raise ConfigError(f'--{e}') from e
  try:
    config.schedules  # pylint: disable=pointless-statement
  except ValueError as e:
    raise ConfigError(str(e)) from e
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
      and config.sampling != 'with_replacement'):
    raise ConfigError(
        f'--clients_per_round={settings["clients_per_round"]} exceeds the'
        f' {task.num_clients} clients of task {task.name!r}.'
    )
  return settings


def _server_optimizer(config: ExperimentConfig, algorithm: registry.Entry,
                      builder_args: dict[str, Any], settings: dict[str, Any]) -> None:
  """Puts the named server optimizer (at the run's server learning rate) into
  `builder_args`, or raises ConfigError for a setting that cannot apply."""
  given = {name: getattr(config, f'server_{name}') for name in ('beta_1', 'beta_2', 'epsilon')
           if getattr(config, f'server_{name}') is not None}
  if config.server_optimizer is None:
    if given:
      raise ConfigError(f'--server_{next(iter(given))} without --server_optimizer: it sets'
                        ' that optimizer\'s hyperparameters.')
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
    builder_args['server_optimizer'] = server_optimizers.build(
        config.server_optimizer, settings['server_learning_rate'], **given)
  except ValueError as e:
    raise ConfigError(str(e)) from e


AGGREGATORS = ('mean', *privacy.KINDS)
_PRIVACY_FLAGS = ('noise_multiplier', 'target_epsilon', 'target_delta')


def _recorded_noise_multiplier(config: ExperimentConfig) -> float | None:
  """A resumed run's calibrated noise multiplier (calibrating again for a changed
  --rounds would change the noise mid-run)."""
  try:
    recorded = json.loads((pathlib.Path(config.output_dir) / 'config.json').read_text())
    return float(recorded['resolved']['noise_multiplier'])
  except (OSError, ValueError, KeyError, TypeError):
    return None


def _model_aggregator(config: ExperimentConfig, algorithm: registry.Entry, task,
                      builder_args: dict[str, Any], settings: dict[str, Any]
                      ) -> accounting.Ledger | None:
  """Puts the --aggregator's `privacy.PrivateMean` into `builder_args` (and the resolved
  noise multiplier and delta into `settings`); returns a DP run's ledger. Raises
  ConfigError for settings that cannot apply."""
  kind = config.aggregator
  if kind not in AGGREGATORS:
    raise ConfigError(f'--aggregator={kind!r} is unknown; choose one of'
                      f' {", ".join(AGGREGATORS)}.')
  given = [name for name in ('clip_norm', *_PRIVACY_FLAGS) if getattr(config, name) is not None]
  if kind == 'mean':
    if given:
      raise ConfigError(f'--{given[0]} sets a clipping or DP aggregator: add'
                        ' --aggregator=clip, dp or dp_adaptive.')
    return None
  if not algorithm.accepts('model_aggregator'):
    raise ConfigError(f'--aggregator: algorithm {config.algorithm!r} takes no model'
                      ' aggregator (its aggregation is its own math).')
  private = kind != privacy.CLIP
  if not private and any(getattr(config, name) is not None for name in _PRIVACY_FLAGS):
    raise ConfigError('--aggregator=clip adds no noise: --noise_multiplier,'
                      ' --target_epsilon and --target_delta go with --aggregator=dp or dp_adaptive.')
  clip_norm = config.clip_norm
  if clip_norm is None:
    if kind != privacy.DP_ADAPTIVE:
      raise ConfigError(f'--aggregator={kind} needs --clip_norm (the L2 norm each client\'s'
                        ' update is clipped to).')
    clip_norm = 0.1  # TFF's initial_l2_norm_clip
  ledger, z = None, 0.0
  n = settings['clients_per_round']
  if private:
    if config.noise_multiplier is None and config.target_epsilon is None:
      raise ConfigError(f'--aggregator={kind} needs --noise_multiplier or --target_epsilon.')
    if config.target_epsilon is not None and not config.target_epsilon > 0:
      raise ConfigError(f'--target_epsilon must be > 0, got {config.target_epsilon}.')
    if config.client_weighting not in (None, 'uniform'):
      raise ConfigError(f'--aggregator={kind} weighs every client alike (TFF\'s DP'
                        ' semantics): drop --client_weighting or set it to uniform.')
    if algorithm.accepts('client_weighting'):
      builder_args['client_weighting'] = settings['client_weighting'] = 'uniform'
    delta = (config.target_delta if config.target_delta is not None
             else accounting.default_delta(task.num_clients))
    try:
      accounting.check(config.sampling, config.accountant, delta, task.num_clients)
      z = config.noise_multiplier
      if z is None and config.resume:
        z = _recorded_noise_multiplier(config)
      if z is None:
        z = accounting.calibrate(
            config.target_epsilon, settings['rounds'], clients_per_round=n,
            population=task.num_clients, sampling=config.sampling, delta=delta,
            accountant=config.accountant)
      ledger = accounting.Ledger(z, n, task.num_clients, config.sampling, delta,
                                 config.accountant)
      if config.target_epsilon is not None and ledger.epsilon(1) > config.target_epsilon:
        raise ValueError(f'one round with noise multiplier {z:.4g} already spends epsilon'
                         f' {ledger.epsilon(1):.3g}, over --target_epsilon.')
    except ValueError as e:
      raise ConfigError(f'--aggregator={kind}: {e}') from e
    settings.update(noise_multiplier=z, target_delta=delta)
  try:
    builder_args['model_aggregator'] = privacy.PrivateMean(
        kind, clip_norm, z, n, config.clip_quantile, config.clip_learning_rate,
        config.clipped_count_stddev)
  except ValueError as e:
    raise ConfigError(f'--aggregator={kind}: {e}') from e
  return ledger


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
  ledger = _model_aggregator(config, algorithm, task, builder_args, settings)
  prepared = Prepared(config, task, algorithm, builder_args, settings, ledger)
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
  if config.resume and config.engine == 'auto':
    try:
      recorded = json.loads((pathlib.Path(config.output_dir) / 'config.json').read_text())
      return (recorded.get('runtime_record') or {}).get('engine') or 'auto'
    except (OSError, ValueError, AttributeError):
      pass
  return config.engine


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
  if (config.sampling == 'with_replacement' and algorithm is not None
      and algorithm.aggregation == aggregation.SLOTS):
    raise ConfigError(f'--sampling=with_replacement: algorithm {config.algorithm!r} keeps'
                      ' a table entry per client, which a client drawn twice would fill'
                      ' twice; use uniform or poisson sampling.')
  settings = prepared.settings
  runtime, description = runner_for(
      program, prepared.task.train_data, config.runtime, config.workers, _engine(config),
      settings['batch_size'], client_rounds=settings['rounds'] * settings['clients_per_round'],
      data_memory_budget=config.data_memory_budget)
  if config.straggler_rate > 0 and not getattr(runtime, 'partial_work', False):
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
  if not prepared.config.schedules[1].constant:
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
      schedules=prepared.config.schedules,
      divergence_hint=prepared.algorithm.divergence_hint,
      checkpoint_every=prepared.config.checkpoint_every,
      resume=prepared.config.resume,
      participation=prepared.config.participation,
      callbacks=_privacy_callbacks(prepared, show_progress),
  )


def _privacy_callbacks(prepared: Prepared, show_progress: bool
                       ) -> tuple[simulation.Callback, ...]:
  """A DP run's accounting: epsilon every round, and an end when --target_epsilon is
  spent (with a fixed --noise_multiplier, or a resumed run given more rounds)."""
  ledger, budget = prepared.ledger, prepared.config.target_epsilon
  if ledger is None:
    return ()
  rounds = prepared.settings['rounds']
  last = rounds if budget is None else ledger.rounds_within(budget, rounds)
  if show_progress:
    print(f'privacy: noise multiplier {ledger.noise_multiplier:.4g}; {ledger.assumption}'
          + (f'; epsilon {budget} lasts {last} rounds' if budget else ''), flush=True)
  return (accounting.PrivacySpent(ledger, last, budget,
                                  every=1 if ledger.accountant == 'rdp'
                                  else prepared.settings['eval_period']),)


def run_experiment(prepared: Prepared, *, show_progress: bool = True) -> dict[str, float]:
  """Builds the process, places it on the configured runtime and trains it; returns
  the final evaluation metrics."""
  return train(prepared, build_runner(prepared), show_progress=show_progress)
