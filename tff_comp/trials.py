"""A grid in one program: `run_trials` runs many runs of one algorithm on one task, those
that differ only in values keeping every shape batched into one compiled round
(`runtime.trial_group`).

A `Trial` is a run's `ExperimentConfig` (its output directory, seed, learning rates,
rounds, participation) and the client rule's hyperparameters set through its hparams
(`client_hparams`, by the rule's names: FedProx's `proximal_strength`), as
`experiment.train_runner` takes them. Trials whose configurations agree but for the
learning rates, `seed`, rounds, evaluation period, cohort and participation, output
directory and resume flags, and whose hparams differ, form a group (private trials:
of one rounds, cohort and participation, which calibrate their noise); a group runs as
one program when its runtime is in-process, else (TFF's runtime, streamed data, the
debug engine) its trials run one after another, said in one line. Each trial writes
what its separate run writes, and equals it to the bit.
"""

from collections.abc import Sequence
import dataclasses
import json
import threading
from typing import Any

from absl import logging

from tff_comp import experiment
from tff_comp.run_config import ExperimentConfig
from tff_comp.runtime import base
from tff_comp.runtime import inprocess
from tff_comp.runtime import trial_group

# The settings a group's trials may differ in (config.json's names): what the loop,
# the sampler and the hparams hold, never the compiled program.
_PER_TRIAL = ('client_learning_rate', 'server_learning_rate', 'seed', 'rounds',
              'eval_period', 'clients_per_round', 'participation', 'output_dir',
              'overwrite', 'resume', 'force_resume', 'checkpoints')
# Of those, what a private aggregator is built from (its noise calibrated to the rounds,
# the cohort and the sampling): private trials share a build only when they agree.
_CALIBRATE_PRIVACY = ('rounds', 'clients_per_round', 'participation')


@dataclasses.dataclass(frozen=True)
class Trial:
  """One run of a grid: its configuration and the client rule's hyperparameters it sets
  through the hparams (by the rule's names)."""

  config: ExperimentConfig
  client_hparams: dict[str, float] = dataclasses.field(default_factory=dict)
  extra_config: dict[str, Any] = dataclasses.field(default_factory=dict)  # config.json's


def group_key(trial: Trial) -> str:
  """What a trial's group shares: its configuration but for `_PER_TRIAL` (the task's
  seed kept: `--seed` seeds the data when `--data_seed` is None; a private run's
  `_CALIBRATE_PRIVACY` kept)."""
  shared = dataclasses.asdict(trial.config)
  private = trial.config.privacy.private
  for name in _PER_TRIAL:
    if not (private and name in _CALIBRATE_PRIVACY):
      del shared[name]
  shared['task_seed'] = trial.config.task_seed
  return json.dumps(shared, sort_keys=True, default=str)


def groups(trials: Sequence[Trial]) -> list[list[int]]:
  """The trials' indices by group, in order of first appearance."""
  by_key: dict[str, list[int]] = {}
  for i, trial in enumerate(trials):
    by_key.setdefault(group_key(trial), []).append(i)
  return list(by_key.values())


def _rates(prepared: experiment.Prepared) -> tuple[float, float]:
  return (prepared.settings['client_learning_rate'],
          prepared.settings['server_learning_rate'])


def _train(prepared: experiment.Prepared, runner: experiment.Runner, trial: Trial) -> Any:
  """One trial's run; returns its final evaluation, or the error that ended it (an
  interruption too: the trials on other threads stop by themselves)."""
  try:
    return experiment.train_runner(
        prepared, runner, show_progress=False, learning_rates=_rates(prepared),
        client_hparams=trial.client_hparams, extra_config=trial.extra_config,
        callbacks=experiment.default_callbacks(prepared, runner, show_progress=False))
  except BaseException as error:  # pylint: disable=broad-except  (the trial's result)
    return error


def run_trials(trials: Sequence[Trial], *, batch: bool = True,
               say: Any = print) -> list[Any]:
  """Runs every trial (see the module docstring); returns each one's final evaluation
  metrics, or the exception that ended it (a divergence, bad settings), in order.
  `batch=False` runs them one after another (one build per group). `say` gets one line
  per group saying how it runs.

  Raises:
    KeyboardInterrupt: Ctrl-C or SIGTERM stopped the trials (`simulation.Interrupted`
      of the first; each saved its last finished round), after every trial stopped.
  """
  results: list[Any] = [None] * len(trials)
  for members in groups(trials):
    try:
      first = experiment.prepare(trials[members[0]].config)
      prepared = [first] + [experiment.prepare(trials[i].config, task=first.task)
                            for i in members[1:]]  # a group shares its task settings
      # Built for the group's client rounds together: 'auto' weighs the lanes kernel's
      # compile against the whole group's local steps.
      settings = prepared[0].settings
      runner = experiment.build_runner(dataclasses.replace(prepared[0], settings=dict(
          settings, rounds=sum(p.settings['rounds'] for p in prepared))))
    except experiment.ConfigError as error:
      for i in members:
        results[i] = error
      continue
    label = f'{prepared[0].config.algorithm} on {prepared[0].config.task}'
    why = _why_not_batched(runner, len(members), batch)
    if why:
      say(f'{label}: {len(members)} trial(s) one after another ({why}).')
      for i, p in zip(members, prepared):
        results[i] = _train(p, runner, trials[i])
        if isinstance(results[i], KeyboardInterrupt):
          raise results[i]
      continue
    group = trial_group.TrialGroup(runner.runtime, [p.config.seed for p in prepared])
    say(f'{label}: {len(members)} trials batched into one program'
        f' ({runner.runtime.description}).')
    threads = []
    for t, (i, p) in enumerate(zip(members, prepared)):
      member = group.member(t)
      trial_runner = dataclasses.replace(runner, runtime=member,
                                         description=member.description)

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
    stopped = [r for r in results if isinstance(r, KeyboardInterrupt)]
    if stopped:
      raise stopped[0]
  return results


def _why_not_batched(runner: experiment.Runner, size: int, batch: bool) -> str:
  """Why a group runs its trials one by one ('' when batched)."""
  if not batch:
    return 'batching off'
  if size < 2:
    return 'a group of one'
  if not isinstance(runner.runtime, inprocess.InProcessRuntime):
    return f'the {runner.runtime.name} runtime runs one trial at a time'
  try:
    trial_group.TrialGroup.check(runner.runtime)
  except base.UnsupportedError as error:
    logging.info('trials one by one: %s', error)
    return str(error)
  return ''
