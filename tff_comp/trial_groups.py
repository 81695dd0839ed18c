"""Which trials of a grid share one build (`tff_comp.trials` runs each group as one
program): a `Trial` is a run's configuration and its client rule's hyperparameters;
trials whose configurations agree but for the settings that may differ by trial
(`settings.setting(per_trial=True)`) form a group.
"""

from collections.abc import Sequence
import dataclasses
import json
from typing import Any

from tff_comp import poisoning
from tff_comp.config import experiment_config
from tff_comp.config.experiment_config import ExperimentConfig
from tff_comp.runtime import base

# Of the per-trial settings, what a private aggregator is built from (its noise
# calibrated to the rounds, the cohort and the sampling): private trials share a build
# only when they agree.
_CALIBRATE_PRIVACY = ('rounds', 'clients_per_round', 'participation')
# Per-trial settings that only set where the aggregator chain starts (a stage's
# `in_state`, declared `settings.setting(chain_state=True)`: a Clip's bound, a trimmed
# mean's fraction, Krum's f, the attackers' fraction): trials differing in them share a
# build, each run starting from its own chain's state (`trials._own_chain_start`) on a
# runtime with the `runtime.base.StartsChains` capability (`trials._by_chain_start`
# splits the others' builds by them). The attackers' fraction of label flipping, which
# poisons the task's data, stays in the group key.
CHAIN_START = experiment_config.declared('chain_state')


@dataclasses.dataclass(frozen=True)
class Trial:
  """One run of a grid: its configuration and the client rule's hyperparameters it sets
  through the hparams (by the rule's names)."""

  config: ExperimentConfig
  client_hparams: dict[str, float] = dataclasses.field(default_factory=dict)
  extra_config: dict[str, Any] = dataclasses.field(default_factory=dict)  # config.json's


def group_key(trial: Trial) -> str:
  """What a trial's group shares: its configuration but for its settings that may differ
  by trial (`settings.setting(per_trial=True)`, `experiment_config.declared`) and the task's
  seed (a private run's `_CALIBRATE_PRIVACY` kept). The group's trials run as one
  program where their tasks' data agree in shape (`_why_not_merged`)."""
  shared = dataclasses.asdict(trial.config)
  private = trial.config.aggregation.private
  agreed = {  # what a runtime's programs need trials to share (`base.GroupsTrials`)
    name
    for options in trial.config.runtime_options.values()
    if isinstance(options, base.GroupsTrials)
    for name in options.trials_agree_on()
  }
  for name in (*experiment_config.declared('per_trial'), 'data_seed'):
    if name in agreed:
      continue
    if name == 'aggregation.attack_fraction' and trial.config.aggregation.attack == poisoning.KIND:
      continue
    if not (private and name.split('.')[0] in _CALIBRATE_PRIVACY):
      *records, field = name.split('.')
      owner = shared
      for record in records:
        owner = owner[record]
      del owner[field]
  return json.dumps(shared, sort_keys=True, default=str)


def groups(trials: Sequence[Trial]) -> list[list[int]]:
  """The trials' indices by group, in order of first appearance."""
  by_key: dict[str, list[int]] = {}
  for i, trial in enumerate(trials):
    by_key.setdefault(group_key(trial), []).append(i)
  return list(by_key.values())


def value(config: ExperimentConfig, name: str) -> Any:
  """The setting `name` (a config.json name: `privacy.clip_norm`) of `config`."""
  for part in name.split('.'):
    config = getattr(config, part)
  return config


def chain_start(config: ExperimentConfig) -> str:
  """The values of `config`'s `CHAIN_START` settings, as a key."""
  return json.dumps([value(config, name) for name in CHAIN_START])
