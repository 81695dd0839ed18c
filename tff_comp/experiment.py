"""One experiment = a registered algorithm on a registered task, validated up front.

`ExperimentConfig` holds every setting; `prepare` (`config.prepared`) checks it and
builds the task, the regularizer and the builder arguments without running any TFF
computation, raising `ConfigError` with a one-line message on bad input; `build_runner`
places the program on its runtime and `run_experiment` trains it. Binaries
(`binaries/run.py`, `binaries/reproduce.py`) are thin layers over these functions.
"""

from collections.abc import Callable, Sequence
import dataclasses
import pathlib
from typing import Any

from tff_comp import evaluation, poisoning, registry, settings
from tff_comp.config import builder_options, experiment_config, run_directory
from tff_comp.config.experiment_config import ExperimentConfig
from tff_comp.config.prepared import Prepared, prepare, resolved_options
from tff_comp.ops import algorithm as algorithm_lib
from tff_comp.ops import communication as communication_lib
from tff_comp.ops import rule as rule_lib
from tff_comp.run import buffered_async, devices, outputs, sampling, training_loop
from tff_comp.run import callbacks as callbacks_lib
from tff_comp.runtime import base as runtime_base
from tff_comp.runtime import choice

__all__ = [
  'ConfigError',
  'ExperimentConfig',
  'Prepared',
  'Runner',
  'build_runner',
  'default_callbacks',
  'prepare',
  'resolved_options',
  'run_experiment',
  'runner_on',
  'train',
  'train_runner',
]

COMMON_ALGORITHM_ARGS = builder_options.COMMON_ALGORITHM_ARGS
COMMON_TASK_ARGS = builder_options.COMMON_TASK_ARGS
DEFAULT_TASK = experiment_config.DEFAULT_TASK
ConfigError = settings.ConfigError  # bad settings; the message is one line for the user


@dataclasses.dataclass
class Runner:
  """A built experiment: the runtime running its rounds (and the line saying which and
  why), and the functions scoring its states."""

  runtime: runtime_base.Runtime
  evaluate: Callable[[Any], dict[str, float]]
  description: str
  algorithm: Any = None  # the ops.algorithm.Algorithm it runs (None: a plugin's process)
  evaluate_clients: Callable[[Any], list[dict]] | None = None  # per-client rows


def build_runner(prepared: Prepared, trials: int = 1) -> Runner:
  """Builds the algorithm and places it on the configured runtime (the in-process
  runtime builds no TFF computation). `trials`: the runs sharing this build
  (`tff_comp.trials`); their client rounds together are what a compile must repay, and
  what a short run's streaming counts (`base.RunFacts.client_rounds`).

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
    program = program.with_client_options(seed=config.seed, shuffle=config.local_work.shuffle)
  algorithm = program if isinstance(program, algorithm_lib.Algorithm) else None
  if (
    config.participation.sampling == 'with_replacement'
    and algorithm is not None
    and algorithm.aggregation.slots
  ):
    raise ConfigError(
      f'--sampling=with_replacement: algorithm {config.algorithm!r} keeps'
      ' a table entry per client, which a client drawn twice would fill'
      ' twice; use uniform or poisson sampling.'
    )
  settings = prepared.settings
  if config.asynchrony.mode == 'async':
    buffered_async.check(
      config,
      prepared.task.train_data,
      algorithm,
      choice.candidates(config.runtime, config.runtime_options),
    )
  runtime, description = choice.runner_for(
    program,
    prepared.task.train_data,
    config.runtime,
    options=config.runtime_options,
    batch_size=settings.batch_size,
    client_rounds=settings.rounds * settings.clients_per_round * trials,
    resumed=run_directory.recorded_runtime(prepared.output_dir) if config.resume else None,
  )
  devices.check_run(config.devices, config.participation.straggler_rate, runtime)
  if config.asynchrony.mode == 'async':  # its description says what it runs on
    runtime = buffered_async.for_run(config, runtime, prepared.task.train_data, algorithm)
    description = runtime.description
  return runner_on(prepared, runtime, description, algorithm)


def runner_on(
  prepared: Prepared, runtime: runtime_base.Runtime, description: str, algorithm: Any = None
) -> Runner:
  """A Runner of `runtime` scored by `prepared`'s task (the global model, personal models
  and per-client rows where the task has them).

  Raises:
    ConfigError: the runtime has personal models the task cannot evaluate.
  """
  evaluate = evaluation.evaluator(
    prepared.task,
    runtime,
    regularizer=prepared.builder_args.get('regularizer'),
    algorithm=prepared.config.algorithm,
  )
  return Runner(
    runtime, evaluate, description, algorithm, evaluation.client_evaluator(prepared.task, runtime)
  )


def default_callbacks(
  prepared: Prepared,
  runner: Runner,
  *,
  show_progress: bool = True,
  extra: Sequence[callbacks_lib.Callback] = (),
) -> list[callbacks_lib.Callback]:
  """The callbacks of a run as configured (`training_loop.standard_callbacks`: schedules,
  divergence guards, the evaluator, progress), with the privacy ledger's (epsilon spent,
  the end of the budget) and `extra` before the progress line. The binaries compose
  their runs from this list; a researcher may add, drop or reorder. A run of an
  Algorithm counts the bytes its rounds send (`callbacks.Communication`)."""
  config, settings_ = prepared.config, prepared.settings
  communication = (
    ()
    if runner.algorithm is None
    else (callbacks_lib.Communication(*communication_lib.client_bytes(runner.algorithm)),)
  )
  poisoned = (
    (
      callbacks_lib.Poisoned(
        poisoning.attackers(
          prepared.task.train_data.client_ids,
          config.aggregation.options_of(registry.ATTACKS.get(poisoning.KIND)).attack_fraction,
          config.task_seed,
        )
      ),
    )
    if config.aggregation.attack == poisoning.KIND
    else ()
  )
  return training_loop.standard_callbacks(
    runner.evaluate,
    eval_period=settings_.eval_period,
    evaluate_clients=runner.evaluate_clients,
    divergence_hint=prepared.algorithm.divergence_hint,
    schedules=config.schedules.pair(),
    show_progress=show_progress,
    extra=(
      *config.privacy.callbacks(
        prepared.ledger, settings_.rounds, settings_.eval_period, show_progress
      ),
      *communication,
      *poisoned,
      *extra,
    ),
    progress_also=(
      ('comm/upload_bytes',)
      if runner.algorithm is not None and communication_lib.compressed(runner.algorithm)
      else ()
    ),
  )


def train_runner(
  prepared: Prepared,
  runner: Runner,
  *,
  show_progress: bool = True,
  learning_rates: tuple[float, float] | None = None,
  client_hparams: dict[str, float] | None = None,
  output_dir: str | None = None,
  extra_config: dict[str, Any] | None = None,
  callbacks: Sequence[callbacks_lib.Callback] | None = None,
) -> dict[str, float]:
  """Trains `runner` (built once, reusable: a grid sets `learning_rates`, and the client
  work's other hparams by name in `client_hparams`, through the process's hparams) into
  `output_dir` (default the config's); returns the final evaluation metrics.
  `extra_config` is recorded in config.json beside the config. `callbacks` are the
  run's (None: `default_callbacks`); the loop adds the run directory's own
  (`training_loop.run_simulation`)."""
  if show_progress:
    print(f'runtime: {runner.description}', flush=True)
  client_hparams = dict(client_hparams or {})
  if client_hparams and learning_rates is None:
    raise ValueError('client_hparams are set together with learning_rates.')
  resolved = resolved_options(prepared, runner.description)
  resolved['algorithm_options'].update(  # the values in force, not the build's
    {k: v for k, v in client_hparams.items() if k in resolved['algorithm_options']}
  )
  if runner.algorithm is not None:  # the client rule's hyperparameters in force, by the
    # rule's names (a grid sets them so: FedProx's `proximal_strength` is its option `mu`)
    in_force = dict(runner.algorithm.client_rule.initial_hparams(), **client_hparams)
    if learning_rates is not None:
      in_force[rule_lib.LEARNING_RATE] = learning_rates[0]
    resolved['client_hparams'] = {k: float(v) for k, v in in_force.items()}
    resolved['server_hparams'] = {
      k: float(v)
      for k, v in runner.algorithm.server_rule.initial_hparams().items()
      if k != rule_lib.LEARNING_RATE
    }
  config = dict(
    dataclasses.asdict(prepared.config),
    resolved=resolved,
    environment=dict(run_directory.environment(), data_files=dict(prepared.inputs)),
    **(extra_config or {}),
  )
  output_dir = output_dir or prepared.output_dir
  run_directory.check_output_dir(output_dir, prepared.config.overwrite, prepared.config.resume)
  try:
    with outputs.output_lock(pathlib.Path(output_dir)):
      # Checked again under the lock: a run started beside this one may have written.
      run_directory.check_output_dir(output_dir, prepared.config.overwrite, prepared.config.resume)
      if callbacks is None:
        callbacks = default_callbacks(prepared, runner, show_progress=show_progress)
      return _train_locked(
        prepared,
        runner,
        config,
        output_dir,
        show_progress,
        learning_rates,
        client_hparams,
        tuple(callbacks),
      )
  except outputs.OutputDirInUse as e:
    raise ConfigError(str(e)) from e


def _train_locked(
  prepared: Prepared,
  runner: Runner,
  config: dict[str, Any],
  output_dir: str,
  show_progress: bool,
  learning_rates: tuple[float, float] | None,
  client_hparams: dict[str, float],
  callbacks: tuple[callbacks_lib.Callback, ...],
) -> dict[str, float]:
  if prepared.config.resume:
    run_directory.check_resumable(
      pathlib.Path(output_dir), config, force=prepared.config.force_resume, inputs=prepared.inputs
    )
  if not prepared.config.schedules.pair()[1].constant:
    runtime = runner.runtime
    if rule_lib.LEARNING_RATE not in runtime.get_hparams(runtime.initialize())['finalizer']:
      raise ConfigError(
        f'--server_lr_schedule: algorithm {prepared.config.algorithm!r}'
        ' has no server learning rate to schedule.'
      )
  if learning_rates is not None and runner.algorithm is not None:
    hparams = dict(
      runner.algorithm.client_rule.initial_hparams(),
      **client_hparams,
      learning_rate=learning_rates[0],
    )
    try:
      runner.algorithm.client_rule.check_hparams(hparams)
    except ValueError as e:
      raise ConfigError(f'algorithm {prepared.config.algorithm!r}: {e}') from e
  return training_loop.run_simulation(
    runner.runtime,
    client_ids=prepared.task.train_data.client_ids,
    rounds=prepared.settings.rounds,
    clients_per_round=prepared.settings.clients_per_round,
    seed=prepared.config.seed,
    output_dir=pathlib.Path(output_dir),
    config=config,
    callbacks=callbacks,
    show_progress=show_progress,
    learning_rates=learning_rates,
    client_hparams=client_hparams,
    checkpoints=prepared.config.checkpoints,
    resume=prepared.config.resume,
    participation=prepared.config.participation,
    sampler=runner.runtime.sampler
    or sampling.timed_sampler(
      prepared.task.train_data,
      prepared.settings.clients_per_round,
      prepared.config.seed,
      prepared.config.participation,
      prepared.config.devices,
      runner.algorithm,
    ),  # an async runtime's own (`buffered_async`)
  )


def run_experiment(
  prepared: Prepared,
  *,
  show_progress: bool = True,
  callbacks: Sequence[callbacks_lib.Callback] = (),
) -> dict[str, float]:
  """Builds the process, places it on the configured runtime and trains it with
  `default_callbacks` and `callbacks` (before the progress line); returns the final
  evaluation metrics."""
  runner = build_runner(prepared)
  return train_runner(
    prepared,
    runner,
    show_progress=show_progress,
    callbacks=default_callbacks(prepared, runner, show_progress=show_progress, extra=callbacks),
  )


def train(
  algorithm: str | ExperimentConfig,
  task: str | None = None,
  *,
  show_progress: bool = True,
  callbacks: Sequence[callbacks_lib.Callback] = (),
  **settings_: Any,
) -> dict[str, float]:
  """Trains the registered `algorithm` on `task` (None: its home task); returns the final
  evaluation metrics. Settings go by their flags' names: the run's and its records'
  (`ExperimentConfig.of`: `rounds=50`, `sampling='poisson'`), the algorithm's options
  (`mu=0.1`) and the task's (`lasso_dataset='II'`, as `--lasso_dataset`), these two
  also whole (`algorithm_options={'mu': 0.1}`, `task_options={'dataset': 'II'}`). `algorithm`
  may instead be a whole `ExperimentConfig` (then nothing else is given). `callbacks`
  join `default_callbacks` before the progress line.

  Raises:
    registry.RegistryError: unknown algorithm or task.
    ConfigError: an unknown setting, or any bad one.
  """
  if isinstance(algorithm, ExperimentConfig):
    extra = (['task'] if task is not None else []) + sorted(settings_)
    if extra:
      raise ConfigError(
        f'train(config): the ExperimentConfig holds every setting; set {", ".join(extra)} in it.'
      )
    return run_experiment(prepare(algorithm), show_progress=show_progress, callbacks=callbacks)
  if not isinstance(algorithm, str):
    raise ConfigError(
      f'train: algorithm is a registered name or an ExperimentConfig, got'
      f' {type(algorithm).__name__}.'
    )
  task_name = experiment_config.task_of(algorithm, task)
  config_names = experiment_config.setting_names()
  own = builder_options.names('algorithm', algorithm)
  task_own = {f'{task_name}_{name}': name for name in builder_options.names('task', task_name)}
  unknown = set(settings_) - config_names - own - set(task_own)
  if unknown:
    raise experiment_config.unknown_settings(unknown, config_names | own | set(task_own))
  given = {k: v for k, v in settings_.items() if k in config_names}
  # The options by name (`mu=0.1`) join those given whole (`algorithm_options={...}`,
  # the config's own field), each name given once.
  options = {
    'algorithm_options': {k: v for k, v in settings_.items() if k not in given and k in own},
    'task_options': {
      task_own[k]: v for k, v in settings_.items() if k not in given and k in task_own
    },
  }
  for field, named in options.items():
    whole = dict(given.pop(field, None) or {})
    if twice := sorted(set(whole) & set(named)):
      raise ConfigError(f'{", ".join(twice)} given both by name and in {field}: give one.')
    named.update(whole)
  config = ExperimentConfig.of(algorithm=algorithm, task=task, **given, **options)
  return run_experiment(prepare(config), show_progress=show_progress, callbacks=callbacks)
