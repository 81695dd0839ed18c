"""A grid in one program: `run_trials` runs many runs of one algorithm on one task, those
that differ only in values keeping every shape batched into one compiled round
(`runtime.inprocess.trials`).

A `Trial` is a run's `ExperimentConfig` (its output directory, seed, learning rates,
rounds, participation) and the client rule's hyperparameters set through its hparams
(`client_hparams`, by the rule's names: FedProx's `proximal_strength`), as
`experiment.train_runner` takes them. Trials whose configurations agree but for the
learning rates, `seed` and `data_seed`, rounds, evaluation period, cohort and
participation, output directory and resume flags, the aggregator settings its chain's
states hold (`trial_groups.CHAIN_START`: each trial starts its chain from its own, on a
runtime with the `runtime.base.StartsChains` capability),
and whose hparams differ, form a
group (with `--engine=auto`, of one rounds and cohort size, by which their separate
runs choose the engine; private trials: of one participation too, which calibrates
their noise). A group runs as one program on the in-process runtime; trials of different
data seeds share it on their tasks' clients together, each sampling, indexing and
evaluating its own, when the tasks' data agree in shape and fit in memory (else one
program per data seed). TFF's runtime, streamed data, the debug engine and
asynchronous steps (`--mode=async`) run a group's trials one after another, one build
per seed (`_one_build_per_seed`). Each says how in one line. Each trial writes what its
separate run writes, and equals it to the bit.
"""

from collections.abc import Iterator, Sequence
import dataclasses
import threading
import time
from typing import Any, NamedTuple

from absl import logging
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
import threadpoolctl

from tff_comp import evaluation, experiment, trial_groups
from tff_comp import task as task_lib
from tff_comp.config.experiment_config import ExperimentConfig
from tff_comp.run import buffered_async
from tff_comp.runtime import base, learning_state
from tff_comp.runtime.inprocess import streaming
from tff_comp.runtime.inprocess import trials as inprocess_trials
from tff_comp.trial_groups import Trial, groups

# MB a batched group's trials may take together (`trial_bytes`); larger groups run in
# chunks.
DEFAULT_MEMORY_BUDGET = 4096.0


def _prepare(configs: Sequence[ExperimentConfig]) -> list[experiment.Prepared]:
  """The configurations prepared, one task built per task seed."""
  first: dict[int, experiment.Prepared] = {}
  prepared = []
  for config in configs:
    prepared.append(experiment.prepare(config, like=first.get(config.task_seed)))
    first.setdefault(config.task_seed, prepared[-1])
  return prepared


def _merged_client_data(sources: Sequence[tuple[str, Any]]) -> Any:
  """The clients of several `ClientData` ((prefix, data) pairs; prefixes end in '/')
  as one, each under its prefix + its id: the data of trials whose tasks differ only
  in their seed, run as one group. In-process and resident only (its dataset function
  takes Python ids; `_why_not_merged` keeps it within the memory budget)."""
  by_prefix = dict(sources)
  ids = [prefix + cid for prefix, data in sources for cid in data.client_ids]

  def dataset(client_id: str):
    prefix, _, own = client_id.partition('/')
    return by_prefix[prefix + '/'].create_tf_dataset_for_client(own)

  return streaming.resident_only(
    tff.simulation.datasets.ClientData.from_clients_and_tf_fn(ids, dataset)
  )


def _why_not_merged(tasks: Sequence[Any], budget_mb: float) -> str:
  """Why the trials on `tasks` (one per task seed) cannot share one program ('' if
  they can): their examples or models differ in shape, or their data together exceed
  the in-process runtime's `--data_memory_budget`."""
  first = tasks[0]
  shapes = [tf.nest.map_structure(np.shape, t.model.initial_weights) for t in tasks]
  if any(
    t.train_data.element_type_structure != first.train_data.element_type_structure for t in tasks
  ) or any(s != shapes[0] for s in shapes):
    return "their tasks' data or models differ in shape"
  megabytes = sum(streaming.estimate_bytes(t.train_data) for t in tasks) / 2**20
  if megabytes > budget_mb:
    return (
      f"their tasks' data, about {megabytes:,.0f} MB together, exceed"
      f' --data_memory_budget={budget_mb:g} MB'
    )
  return ''


class _Program(NamedTuple):
  """Trials sharing one build: their indices, their prepared runs, the runner, and
  (trials on several tasks' data) where each one's clients are and its initial state."""

  members: list[int]
  prepared: list[experiment.Prepared]
  runner: experiment.Runner
  clients: list[inprocess_trials.TrialClients] | None = None
  initial: list[Any] | None = None


def _build(members: list[int], prepared: list[experiment.Prepared]) -> _Program:
  """One build for the trials `members` (their runs `prepared`), on their tasks' clients
  together when they are several (`_merged_client_data`)."""
  first = prepared[0]  # built for one trial's run, as each trial's separate run is
  tasks = list({id(p.task): p.task for p in prepared}.values())
  if len(tasks) == 1:
    return _Program(members, prepared, experiment.build_runner(first, len(members)))
  prefixes = {id(task): f'{k}/' for k, task in enumerate(tasks)}
  data = _merged_client_data([(prefixes[id(task)], task.train_data) for task in tasks])
  runner = experiment.build_runner(
    dataclasses.replace(first, task=task_lib.with_train_data(first.task, data)),
    len(members),
  )
  runtime = runner.runtime
  if not isinstance(runtime, base.ClientOutputs):  # `trial_groups` merges data for these only
    raise experiment.ConfigError(
      f"{runtime.description}: trials on several tasks' data share a build in-process only."
    )
  initial, starts = {}, []
  for p in prepared:  # each trial from its own task's model (the data seed's) and chain
    start = (
      id(p.task),
      trial_groups.chain_start(p.config),
    )
    if start not in initial:
      initial[start] = learning_state.initial_state(_built(p), runtime.device, len(data.client_ids))
    starts.append(start)
  return _Program(
    members,
    prepared,
    runner,
    [
      inprocess_trials.TrialClients(
        prefixes[id(p.task)], {cid: i for i, cid in enumerate(p.task.train_data.client_ids)}
      )
      for p in prepared
    ],
    [initial[start] for start in starts],
  )


def _programs(
  members: list[int], prepared: list[experiment.Prepared], batch: bool, say: Any
) -> list[_Program]:
  """The builds a group's trials run on: one, over every task seed's data where they
  can share it (else one per task seed, said in one line)."""
  by_seed: dict[int, list[int]] = {}
  for k, p in enumerate(prepared):
    by_seed.setdefault(p.config.task_seed, []).append(k)
  parts = [list(range(len(prepared)))]
  if prepared[0].config.asynchrony.mode == 'async':  # one at a time, each on its data
    parts = list(by_seed.values())
  elif batch and len(by_seed) > 1:
    budget = min(
      (
        options.data_memory_budget
        for options in prepared[0].config.runtime_options.values()
        if isinstance(options, base.GroupsTrials)
      ),
      default=0.0,
    )
    why = _why_not_merged([prepared[ks[0]].task for ks in by_seed.values()], budget)
    if why:
      say(f'{_label(prepared[0])}: one program per data seed ({why}).')
      parts = list(by_seed.values())
  elif len(by_seed) > 1:
    parts = list(by_seed.values())
  programs = [_build([members[k] for k in part], [prepared[k] for k in part]) for part in parts]
  return [each for program in programs for each in _by_chain_start(program)]


def _by_chain_start(program: _Program) -> list[_Program]:
  """`program`, where its build starts each trial's aggregator chain from the trial's
  own state (`_own_chain_start`: an Algorithm, whose trials' chains agree in structure, as
  `trial_groups.CHAIN_START` keeps them, on a runtime with the `base.StartsChains`
  capability); trials whose chains differ otherwise (a secure sum's modulus sized to the
  cohort) get a build per structure, and on a runtime without the capability (TFF's,
  which bakes the chain into its factories) one per `trial_groups.CHAIN_START` value."""
  by_start: dict[str, list[int]] = {}
  starts = isinstance(program.runner.runtime, base.StartsChains)
  for k, p in enumerate(program.prepared):
    chain = None if program.runner.algorithm is None else _built(p).model_chain
    key = '' if chain is None else chain.structure()
    if not starts:
      key += trial_groups.chain_start(p.config)
    by_start.setdefault(key, []).append(k)
  if len(by_start) == 1:
    return [program]
  return [
    _build([program.members[k] for k in part], [program.prepared[k] for k in part])
    for part in by_start.values()
  ]


def _label(prepared: experiment.Prepared) -> str:
  return f'{prepared.config.algorithm} on {prepared.config.task}'


def _rates(prepared: experiment.Prepared) -> tuple[float, float]:
  return (prepared.settings.client_learning_rate, prepared.settings.server_learning_rate)


def _train(prepared: experiment.Prepared, runner: experiment.Runner, trial: Trial) -> Any:
  """One trial's run; returns its final evaluation, or the error that ended it (an
  interruption too: the trials on other threads stop by themselves)."""
  try:
    return experiment.train_runner(
      prepared,
      runner,
      show_progress=False,
      learning_rates=_rates(prepared),
      client_hparams=trial.client_hparams,
      extra_config=trial.extra_config,
      callbacks=experiment.default_callbacks(prepared, runner, show_progress=False),
    )
  except BaseException as error:  # the trial's result
    return error


def one_blas_thread() -> None:
  """NumPy's BLAS (the tasks' evaluations) on one thread in this process. Its idle
  threads spin (OpenBLAS's sched_yield) between calls, taking a core from the rounds:
  in fco_lasso's feddualavg grid, 38 s of system time in 106 s of CPU one run after
  another, 13 s in 47 s batched; 6 s each with one thread. A grid's processes and its
  trials' threads fill the cores themselves."""
  threadpoolctl.threadpool_limits(limits=1, user_api='blas')


def trial_bytes(runtime: base.Runtime, clients_per_round: int) -> int:
  """A trial's memory in a batched round, estimated: its state four times (stacked in
  and out, on the device and the host) and, per client of its cohort, eight copies of
  the model (payload row, lane and stored local state, update, outputs)."""

  def size(structure) -> int:
    return sum(np.asarray(leaf).nbytes for leaf in tf.nest.flatten(structure))

  state = runtime.initialize()
  return 4 * size(state) + 8 * clients_per_round * size(state.global_model_weights)


def run_trials(
  trials: Sequence[Trial],
  *,
  batch: bool = True,
  say: Any = print,
  memory_budget: float = DEFAULT_MEMORY_BUDGET,
) -> list[Any]:
  """Runs every trial (see the module docstring); returns each one's final evaluation
  metrics, or the exception that ended it (a divergence, bad settings), in order.
  `batch=False` runs them one after another (one build per group and data seed). `say`
  gets one line per group saying how it runs. A group whose trials would take more than
  `memory_budget` MB together (`trial_bytes`) runs in chunks, said in one line.

  Raises:
    KeyboardInterrupt: Ctrl-C or SIGTERM stopped the trials (`training_loop.Interrupted`
      of the first; each saved its last finished round), after every trial stopped.
  """
  results: list[Any] = [None] * len(trials)
  with threadpoolctl.threadpool_limits(limits=1, user_api='blas'):  # `one_blas_thread`
    for members in groups(trials):
      try:
        programs = _programs(members, _prepare([trials[i].config for i in members]), batch, say)
      except experiment.ConfigError as error:
        for i in members:
          results[i] = error
        continue
      for program in programs:
        _run_program(program, trials, results, batch, say, memory_budget)
  return results


def _run_program(
  program: _Program,
  trials: Sequence[Trial],
  results: list[Any],
  batch: bool,
  say: Any,
  memory_budget: float,
) -> None:
  """Runs one build's trials, batched (in chunks within `memory_budget`) or one after
  another; their results into `results`."""
  runner, label, size = program.runner, _label(program.prepared[0]), len(program.members)
  why = _why_not_batched(runner, size, batch)
  if why:
    say(f'{label}: {size} trial(s) one after another ({why}).')
    for i, p, seed_runner in _one_build_per_seed(program, say):
      results[i] = _train(p, _own_schedule(seed_runner, p), trials[i])
      if isinstance(results[i], KeyboardInterrupt):
        raise results[i]
    return
  per_trial = (
    max(trial_bytes(runner.runtime, p.settings.clients_per_round) for p in program.prepared) / 2**20
  )
  chunk = max(1, min(size, int(memory_budget // per_trial)))
  seeds = len({id(p.task) for p in program.prepared})
  on = f", on {seeds} data seeds' clients" if seeds > 1 else ''
  if chunk < size:
    say(
      f'{label}: {size} trials batched in {-(-size // chunk)} programs of up to {chunk}'
      f' (about {per_trial:,.1f} MB a trial, --batch_memory_budget={memory_budget:g}'
      f' MB){on} ({runner.runtime.description}).'
    )
  else:
    say(f'{label}: {size} trials batched into one program{on} ({runner.runtime.description}).')
  for start in range(0, size, chunk):
    _run_batched(program, range(start, min(size, start + chunk)), trials, results, say)


def _run_batched(
  program: _Program, part: range, trials: Sequence[Trial], results: list[Any], say: Any
) -> None:
  """The trials `part` of `program` (positions in it) as one group, each on a thread;
  says how long its rounds took, and how much of it the compiled round."""
  started = time.monotonic()
  runtime = program.runner.runtime
  assert isinstance(runtime, base.BatchesTrials), 'batched only where it can be (_why_not_batched)'
  group = runtime.trial_group(
    [program.prepared[k].config.seed for k in part],
    None if program.clients is None else [program.clients[k] for k in part],
  )
  # A task's evaluation was not written for threads (tasks.base.Scorer built its graph
  # lazily and raced in two trials): the program's trials evaluate one at a time, their
  # models together when every trial waits (`_together`), the rows per client under
  # a lock.
  evaluating = threading.Lock()
  threads = []
  for t, k in enumerate(part):
    i, p = program.members[k], program.prepared[k]
    if program.initial is not None:
      initial = program.initial[k]
    else:  # its own chain's start, where it differs from the build's
      own = _own_chain_start(program.runner, p)
      initial = None if own is None else _starting_chain_at(runtime, own).initialize()
    member = group.member(t, initial)
    trial_runner = experiment.runner_on(p, member, member.description, program.runner.algorithm)
    trial_runner = dataclasses.replace(
      trial_runner,
      evaluate=_together(member, trial_runner.evaluate),
      evaluate_clients=_holding(evaluating, trial_runner.evaluate_clients),
    )

    def run(i=i, p=p, member=member, trial_runner=trial_runner):
      try:
        results[i] = _train(p, trial_runner, trials[i])
      finally:
        member.leave()

    threads.append(threading.Thread(target=run, name=f'trial-{i}'))
  for thread in threads:
    thread.start()
  for thread in threads:
    thread.join()
  say(
    f'{_label(program.prepared[0])}: {len(part)} trials, {group.rounds_run} batched rounds'
    f' in {time.monotonic() - started:.1f} s; the compiled round {group.round_seconds:.1f}'
    f' s of them (rounds 2 on).'
  )
  stopped = [
    results[program.members[k]]
    for k in part
    if isinstance(results[program.members[k]], KeyboardInterrupt)
  ]
  if stopped:
    raise stopped[0]


def _together(member: inprocess_trials.TrialRuntime, evaluate: Any) -> Any:
  """`evaluate` of the trial `member`, run with the other trials' evaluations once every
  trial of the group waits (`TrialGroup.together`): a task that scores several models
  at once reads its data once for all (`evaluation.evaluate_together`). None: None."""
  if evaluate is None:
    return None

  def asked(state):
    return member.together((evaluate, state), evaluation.evaluate_together)

  return asked


def _holding(lock: threading.Lock, fn: Any) -> Any:
  """`fn` (None: None) called under `lock`."""
  if fn is None:
    return None

  def held(*args):
    with lock:
      return fn(*args)

  return held


def _one_build_per_seed(
  program: _Program, say: Any
) -> Iterator[tuple[int, experiment.Prepared, experiment.Runner]]:
  """(trial index, its prepared run, its runner) for the program's trials run one by one,
  a seed's trials together. A build's compiled round holds its run's seed (clients'
  shuffling and epoch draws, the aggregator's draws and noise): each seed gets a build
  of its own, on its own task's data, the one before it released (said in one line)."""
  by_seed: dict[int, list[int]] = {}
  for k, p in enumerate(program.prepared):
    by_seed.setdefault(p.config.seed, []).append(k)
  first = program.prepared[0]
  if len(by_seed) > 1:
    say(
      f'{_label(first)}: one build per seed ({len(by_seed)}), whose compiled round holds'
      ' the seed of its draws.'
    )
  for seed, ks in by_seed.items():
    # The program's build serves its first trial's seed, unless built on several
    # tasks' clients together.
    reuse = seed == first.config.seed and program.clients is None
    runner = program.runner if reuse else experiment.build_runner(program.prepared[ks[0]], len(ks))
    for k in ks:
      yield program.members[k], program.prepared[k], runner


def _own_schedule(runner: experiment.Runner, prepared: experiment.Prepared) -> experiment.Runner:
  """`runner` for `prepared`'s trial run alone: an async run's schedule is its seed's
  (the build shared), and it starts from its own aggregator chain's state."""
  runtime = runner.runtime
  if prepared.config.asynchrony.mode == 'async':
    # The trial's own sampling and async settings (they may differ from the build's).
    buffered_async.check(prepared.config, prepared.task.train_data, runner.algorithm)
    assert isinstance(runtime, buffered_async.BufferedAsyncRuntime), 'an async run is built so'
    runtime = buffered_async.for_run(
      prepared.config, runtime.driver, prepared.task.train_data, runner.algorithm
    )
  own = _own_chain_start(runner, prepared)
  if own is not None:
    runtime = _starting_chain_at(runtime, own)
  return dataclasses.replace(runner, runtime=runtime)


def _starting_chain_at(runtime: base.Runtime, own: Any) -> base.Runtime:
  """`runtime` (its build shared) starting its aggregator chain at `own`."""
  if not isinstance(runtime, base.StartsChains):
    raise experiment.ConfigError(
      f'{runtime.description}: trials differing in {", ".join(trial_groups.CHAIN_START)}'
      ' share a build only on a runtime that starts chains where told.'
    )
  return runtime.starting_chain_at(own)


def _own_chain_start(runner: experiment.Runner, prepared: experiment.Prepared) -> Any:
  """The state `prepared`'s trial starts its aggregator chain from when that differs
  from the build `runner`'s (`trial_groups.CHAIN_START`); None when they agree."""
  built = None if runner.algorithm is None else runner.algorithm.model_chain
  if built is None:
    return None
  own = _built(prepared).model_chain.initial_state()
  leaves = zip(tf.nest.flatten(own), tf.nest.flatten(built.initial_state()), strict=True)
  return None if all(np.array_equal(a, b) for a, b in leaves) else own


def _built(prepared: experiment.Prepared) -> Any:
  """`prepared`'s Algorithm (its build's; one line for a chain that cannot work)."""
  try:
    return prepared.build()
  except ValueError as e:
    raise experiment.ConfigError(f'algorithm {prepared.config.algorithm!r}: {e}') from e


def _why_not_batched(runner: experiment.Runner, size: int, batch: bool) -> str:
  """Why a build's trials run one by one ('' when batched)."""
  if not batch:
    return 'batching off'
  if size < 2:
    return 'a group of one'
  if not isinstance(runner.runtime, base.BatchesTrials):
    return f'{runner.runtime.description} runs one trial at a time'
  reason = runner.runtime.why_not_batched()
  if reason:
    logging.info('trials one by one: %s', reason)
  return reason
