"""absl flags for experiments, derived from the registered builders' signatures.

Common flags cover what every run sets. Each algorithm's extra keyword-only
hyperparameters become a flag of the same name (shared when two algorithms use the
same name); each task option becomes `--<task>_<option>`. Plugin flags default to
None, so a flag is passed on only when given, and a flag given for an algorithm or
task that was not chosen is an error.
"""

from collections.abc import Callable
import inspect
import logging as std_logging
import os
import sys

from absl import flags
from absl import logging

from tff_comp import experiment
from tff_comp import registry
from tff_comp.binaries import flag_check
from tff_comp import regularizers
from tff_comp import schedules
from tff_comp import server_optimizers
from tff_comp.ops import client_round
from tff_comp.runtime import inprocess
from tff_comp.runtime import simulation
from tff_comp.runtime import workers as workers_lib

# Bounds of integer flags, so an absurd value is a flag error, not an overflow later.
_MAX_INT32, _MAX_COUNT, _MAX_SEED = 2**31 - 1, 10**8, 2**32 - 1
_DEFINE = {float: flags.DEFINE_float, int: flags.DEFINE_integer,
           bool: flags.DEFINE_bool, str: flags.DEFINE_string}


fail = flag_check.fail


_HELP = ('--help', '--helpfull', '--helpshort', '-h', '-?', '--help=true', '--helpfull=true')


def _print_help() -> None:
  """The binary's usage and its own flags (not those every imported library defines,
  absl.testing's and TensorFlow's TPU flags among them, which absl's --helpfull lists),
  then exit 0."""
  main = sys.modules['__main__']
  print((main.__doc__ or '').strip() + '\n')
  print(flags.FLAGS.main_module_help())
  print(flags.FLAGS.module_help(__name__))
  print('\nAlso --flagfile=FILE (flags, one a line) and --verbosity=N (absl logging).')
  sys.exit(0)


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
  flag_check.record(flags.FLAGS, flag_check.program())  # for the next start's check
  if any(arg.split('=')[0] in _HELP for arg in argv[1:]):
    _print_help()
  try:
    return flags.FLAGS(argv)
  except UnicodeDecodeError as e:
    fail(f'a --flagfile is not a text file of flags ({e}).')
  except (flags.Error, OSError) as e:
    fail(e)


class _PipeSafeStdout:
  """stdout that, once its reader has gone (`run.py | head -1`), sends the rest of the
  output to /dev/null instead of raising BrokenPipeError, so the run goes on."""

  def __init__(self, stream):
    self._stream = stream

  def _to_devnull(self) -> None:
    # Python's documented recipe: the stream's fd now points at /dev/null, so what is
    # still buffered and everything after it (also the flush at exit) goes there.
    os.dup2(os.open(os.devnull, os.O_WRONLY), self._stream.fileno())

  def write(self, text: str) -> int:
    try:
      return self._stream.write(text)
    except BrokenPipeError:
      self._to_devnull()
      return len(text)

  def flush(self) -> None:
    try:
      self._stream.flush()
    except BrokenPipeError:
      self._to_devnull()

  def __getattr__(self, name):
    return getattr(self._stream, name)


def closing_stdout_quietly(main: Callable[[list[str]], None]) -> Callable[[list[str]], None]:
  """`main`, where a reader closing stdout early (`run.py | head -1`) is not an error:
  output stops, the run completes and writes its files, exit status 0."""

  def wrapped(argv: list[str]) -> None:
    if not isinstance(sys.stdout, _PipeSafeStdout):
      sys.stdout = _PipeSafeStdout(sys.stdout)
    main(argv)
    sys.stdout.flush()

  return wrapped


def _listing(table: registry.Registry) -> str:
  """'name: one line' per registered name."""
  return '\n'.join(f'  {name}: {table.get(name).summary}' for name in table.names())


def _define(h: registry.Hparam, flag: str, help_text: str, choices=()) -> None:
  """A flag for hyperparameter `h` (an enum when it has choices), default None."""
  if choices:
    flags.DEFINE_enum(flag, None, [str(c) for c in choices], help_text)
  elif h.type is int:
    flags.DEFINE_integer(flag, None, help_text, upper_bound=_MAX_INT32)
  else:
    _DEFINE[h.type](flag, None, help_text)


def define_common_flags() -> None:
  """Flags shared by every run."""
  flags.DEFINE_string('algo', 'feddualavg', 'Registered algorithm:\n' + _listing(registry.ALGORITHMS))
  flags.DEFINE_string('task', None, 'Registered task (default: the algorithm\'s home task,'
                      ' with settings that work for the pair; else lasso):\n'
                      + _listing(registry.TASKS))
  flags.DEFINE_integer('rounds', None, 'Training rounds (default: the task\'s).',
                       upper_bound=_MAX_COUNT)
  flags.DEFINE_integer('clients_per_round', None, 'Clients sampled per round.',
                       upper_bound=_MAX_COUNT)
  flags.DEFINE_float('client_learning_rate', None, 'Client learning rate eta_c.')
  flags.DEFINE_float('server_learning_rate', None, 'Server learning rate eta_s.')
  flags.DEFINE_integer('batch_size', None, 'Examples per local step.',
                       upper_bound=_MAX_INT32)
  flags.DEFINE_integer('local_epochs', None, 'Local passes over client data per round.',
                       upper_bound=client_round.MAX_EPOCHS)
  flags.DEFINE_enum('client_weighting', None, list(client_round.WEIGHTINGS),
                    'Weigh clients by examples or uniformly (default: the algorithm\'s).')
  flags.DEFINE_integer('eval_period', None, 'Evaluate every this many rounds.',
                       upper_bound=_MAX_COUNT)
  flags.DEFINE_integer('seed', 0, 'Seed of the run: client sampling and client-side draws.',
                       lower_bound=0, upper_bound=_MAX_SEED)
  flags.DEFINE_bool('shuffle', True, 'Each client visits its examples in a new order every'
                    ' round and epoch (a stateless permutation of seed, round, client and'
                    ' epoch); --noshuffle: stored order.')
  flags.DEFINE_enum('sampling', 'uniform', list(simulation.SAMPLINGS),
                    'How each round\'s clients are drawn: uniform (--clients_per_round'
                    ' distinct clients), with_replacement, or poisson (each client with'
                    ' probability clients_per_round / population; cohorts vary in size).')
  flags.DEFINE_float('dropout_rate', 0.0, 'Chance that a sampled client fails to report'
                     ' (its update is lost; a round nobody reports leaves the model as'
                     ' it was).')
  flags.DEFINE_float('straggler_rate', 0.0, 'Chance that a reporting client straggles,'
                     ' doing only --straggler_work of its local steps (in-process runtime).')
  flags.DEFINE_float('straggler_work', 0.5, 'The share of its local steps a straggler'
                     ' completes (at least one step).')
  flags.DEFINE_integer('data_seed', 0, 'Seed of the task: generated data, partition and'
                       ' initial model.', lower_bound=0, upper_bound=_MAX_SEED)
  flags.DEFINE_string('output_dir', None, 'Where metrics go (default runs/<algo>-<task>).')
  flags.DEFINE_bool('overwrite', False, 'Replace a run already in --output_dir.')
  flags.DEFINE_bool('resume', False, 'Continue the run in --output_dir from its last'
                    ' checkpoint (its configuration must match; --rounds may grow).')
  flags.DEFINE_float('data_memory_budget', 4096.0, 'MB the clients\' examples may take'
                     ' resident on the in-process runtime; a population estimated larger'
                     ' streams each round\'s cohort from its ClientData instead (the next'
                     ' cohort read while a round runs; mapped engine). 0: always stream.')
  flags.DEFINE_integer('checkpoint_every', 50, 'Save the process state every this many'
                       ' rounds (and at the last), for --resume.')
  flags.DEFINE_enum('regularizer', None, sorted(regularizers.REGULARIZERS),
                    'Regularizer psi (default: the task\'s).')
  flags.DEFINE_enum('runtime', 'auto', experiment.runtime_names(),
                    'Where rounds run: inprocess (the math in one tf.function per round;'
                    ' fast, GPU when TensorFlow sees one), tff (TFF\'s C++ worker), or'
                    ' auto (inprocess where the algorithm supports it).')
  flags.DEFINE_enum('engine', 'auto', list(inprocess.ENGINES),
                    'The in-process runtime\'s engine: lanes (XLA, many small clients),'
                    ' mapped (client by client), debug (eager; a failure names the client'
                    ' and stage), or auto (lanes where the local step suits XLA).')
  flags.DEFINE_string('workers', None,
                      'host:port,... of TFF workers to split each round\'s clients across'
                      ' (TFF\'s runtime; start one per host with `python -m'
                      ' tff_comp.binaries.worker --port=PORT`; private network only).')
  flags.DEFINE_float('regularizer_strength', None,
                     'Strength lam of psi, or radius of a ball constraint.')
  flags.DEFINE_enum('server_optimizer', None, list(server_optimizers.NAMES),
                    'The server\'s optimizer at --server_learning_rate, for algorithms'
                    ' whose server runs one (default: the algorithm\'s own, SGD): sgdm'
                    ' (FedAvgM), adam, yogi, adagrad (FedAdam, FedYogi, FedAdagrad of Reddi'
                    ' et al. 2021).')
  flags.DEFINE_float('server_beta_1', None, 'The server optimizer\'s first-moment decay'
                     ' (sgdm: its momentum; default 0.9).', lower_bound=0.0)
  flags.DEFINE_float('server_beta_2', None, 'The server optimizer\'s second-moment decay'
                     ' (adam, yogi; default 0.99).', lower_bound=0.0)
  flags.DEFINE_enum('client_lr_schedule', 'constant', list(schedules.NAMES),
                    'The client learning rate over rounds: constant, exponential'
                    ' (times --lr_decay_rate every --lr_decay_rounds rounds) or'
                    ' inverse_sqrt (linear warmup over --lr_warmup_rounds, then'
                    ' sqrt(warmup / round)).')
  flags.DEFINE_enum('server_lr_schedule', 'constant', list(schedules.NAMES),
                    'The server learning rate over rounds (as --client_lr_schedule).')
  flags.DEFINE_float('lr_decay_rate', 0.5, 'Exponential schedules\' factor per'
                     ' --lr_decay_rounds rounds, in (0, 1].')
  flags.DEFINE_integer('lr_decay_rounds', 100, 'Rounds over which an exponential'
                       ' schedule decays by --lr_decay_rate.', lower_bound=1,
                       upper_bound=_MAX_COUNT)
  flags.DEFINE_integer('lr_warmup_rounds', 10, 'Warmup rounds of an inverse_sqrt'
                       ' schedule.', lower_bound=1, upper_bound=_MAX_COUNT)
  flags.DEFINE_enum('aggregator', 'mean', list(experiment.AGGREGATORS),
                    'What averages the model delta (side channels stay exact): mean (the'
                    ' algorithm\'s own); clip (each client\'s update clipped to'
                    ' --clip_norm, then the weighted mean); dp (clipped, summed, Gaussian'
                    ' noise of std noise_multiplier x clip_norm, divided by'
                    ' --clients_per_round: TFF\'s DP-FedAvg semantics, uniform client'
                    ' weights); dp_adaptive (dp with the clip adapting to'
                    ' --clip_quantile of the update norms). Both runtimes run all four.')
  flags.DEFINE_float('clip_norm', None, 'L2 norm client updates are clipped to (clip, dp;'
                     ' dp_adaptive: the initial clip, default 0.1).')
  flags.DEFINE_float('noise_multiplier', None, 'dp/dp_adaptive: noise std over the clip'
                     ' norm (dp_adaptive: the effective total, as TFF\'s).')
  flags.DEFINE_float('target_epsilon', None, 'dp/dp_adaptive: the privacy budget. Without'
                     ' --noise_multiplier, the noise is calibrated so that --rounds rounds'
                     ' spend it; with it, the run stops (state saved) when it is spent.')
  flags.DEFINE_float('target_delta', None, 'dp/dp_adaptive: the delta epsilon is stated'
                     ' at (default population^-1.1; must be below 1/population; --delta is'
                     ' Per-FedAvg\'s finite-difference step).')
  flags.DEFINE_float('clip_quantile', 0.5, 'dp_adaptive: the quantile of update norms the'
                     ' clip adapts to.')
  flags.DEFINE_float('clip_learning_rate', 0.2, 'dp_adaptive: the clip\'s geometric'
                     ' learning rate.')
  flags.DEFINE_float('clipped_count_stddev', None, 'dp_adaptive: noise std of the clipped'
                     ' count (default 0.05 x --clients_per_round; must exceed half the'
                     ' noise multiplier).')
  flags.DEFINE_enum('accountant', 'rdp', ['rdp', 'pld'], 'dp/dp_adaptive: the privacy'
                    ' accountant (dp_accounting): rdp (epsilon every round; any sampling)'
                    ' or pld (tighter; Poisson sampling; epsilon at evaluations).')
  flags.DEFINE_float('server_epsilon', None, 'The adaptive server optimizers\' epsilon'
                     ' (Reddi et al.\'s tau; default 1e-3).')


def _plugin_flags() -> tuple[dict[str, list[str]], dict[str, tuple[str, str]]]:
  """(algorithm flag -> algorithms using it, task flag -> (task, option))."""
  algo_flags: dict[str, list[str]] = {}
  types: dict[str, type] = {}
  for name in registry.ALGORITHMS.names():
    for h in registry.get_algorithm(name).hparams:
      if h.name in experiment.COMMON_ALGORITHM_ARGS:
        continue
      if types.setdefault(h.name, h.type) is not h.type:
        first = algo_flags[h.name][0]
        pair = sorted([(name, h.type), (first, types[h.name])],
                      key=lambda p: registry.get_algorithm(p[0]).builder.__module__.startswith(
                          'tff_comp.'))  # the plugin first
        (a, a_type), (b, b_type) = pair
        raise registry.RegistryError(
            f'--{h.name}: algorithm {a!r} ({registry.get_algorithm(a).builder.__module__})'
            f' takes it as {a_type.__name__}, {b!r}'
            f' ({registry.get_algorithm(b).builder.__module__}) as {b_type.__name__};'
            ' rename one of the options.')
      algo_flags.setdefault(h.name, []).append(name)
  task_flags = {}
  for name in registry.TASKS.names():
    for h in registry.get_task(name).hparams:
      if h.name not in experiment.COMMON_TASK_ARGS:
        task_flags[f'{name}_{h.name}'] = (name, h.name)
  return algo_flags, task_flags


def _hparam(entry: registry.Entry, name: str) -> registry.Hparam:
  return next(h for h in entry.hparams if h.name == name)


def _default(h: registry.Hparam) -> str:
  return '' if h.default is inspect.Parameter.empty else f' (default {h.default!r})'


def define_plugin_flags() -> tuple[dict[str, list[str]], dict[str, tuple[str, str]]]:
  """Defines algorithm and task option flags; returns their owners."""
  algo_flags, task_flags = _plugin_flags()
  for flag, users in algo_flags.items():
    owners = [(user, _hparam(registry.get_algorithm(user), flag)) for user in users]
    choices = sorted({c for _, h in owners for c in h.choices})
    texts = {registry.get_algorithm(u).option_help(flag) for u in users}
    if len(texts) == 1:  # one meaning: say it once, then who takes it
      text = f'{texts.pop()} Option of ' + ', '.join(
          f'{u}{_default(h)}' for u, h in owners) + '.'
    else:
      text = ' '.join(f'{u}{_default(h)}: {registry.get_algorithm(u).option_help(flag)}'
                      for u, h in owners)
    _define(owners[0][1], flag, text.strip(), choices)
  for flag, (task, option) in task_flags.items():
    entry = registry.get_task(task)
    h = _hparam(entry, option)
    _define(h, flag, f'Task {task}{_default(h)}: {entry.option_help(option)}'.strip(),
            h.choices)
  return algo_flags, task_flags


def _workers(spec: str | None) -> tuple[str, ...]:
  try:
    return tuple(workers_lib.parse_addresses(spec)) if spec is not None else ()
  except ValueError as e:
    raise experiment.ConfigError(str(e)) from e


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
  algorithm_options = {f: values[f].value for f in algo_flags if values[f].present}
  chosen = values.task or registry.get_algorithm(values.algo).home_task or experiment.DEFAULT_TASK
  task_options = {}
  for flag, (task, option) in task_flags.items():
    if values[flag].present:
      if task != chosen:
        raise experiment.ConfigError(
            f'--{flag} is an option of task {task!r}, not of {chosen!r}.'
        )
      task_options[option] = values[flag].value
  return experiment.ExperimentConfig(
      algorithm=values.algo,
      task=values.task,
      rounds=values.rounds,
      clients_per_round=values.clients_per_round,
      client_learning_rate=values.client_learning_rate,
      server_learning_rate=values.server_learning_rate,
      batch_size=values.batch_size,
      local_epochs=values.local_epochs,
      client_weighting=values.client_weighting,
      eval_period=values.eval_period,
      seed=values.seed,
      shuffle=values.shuffle,
      sampling=values.sampling,
      dropout_rate=values.dropout_rate,
      straggler_rate=values.straggler_rate,
      straggler_work=values.straggler_work,
      data_seed=values.data_seed,
      regularizer=values.regularizer,
      regularizer_strength=values.regularizer_strength,
      server_optimizer=values.server_optimizer,
      server_beta_1=values.server_beta_1,
      server_beta_2=values.server_beta_2,
      server_epsilon=values.server_epsilon,
      client_lr_schedule=values.client_lr_schedule,
      server_lr_schedule=values.server_lr_schedule,
      lr_decay_rate=values.lr_decay_rate,
      lr_decay_rounds=values.lr_decay_rounds,
      lr_warmup_rounds=values.lr_warmup_rounds,
      aggregator=values.aggregator,
      clip_norm=values.clip_norm,
      noise_multiplier=values.noise_multiplier,
      target_epsilon=values.target_epsilon,
      target_delta=values.target_delta,
      clip_quantile=values.clip_quantile,
      clip_learning_rate=values.clip_learning_rate,
      clipped_count_stddev=values.clipped_count_stddev,
      accountant=values.accountant,
      algorithm_options=algorithm_options,
      task_options=task_options,
      output_dir=values.output_dir,
      runtime=values.runtime,
      engine=values.engine,
      workers=_workers(values.workers),
      overwrite=values.overwrite,
      resume=values.resume,
      checkpoint_every=values.checkpoint_every,
      data_memory_budget=values.data_memory_budget,
  )
