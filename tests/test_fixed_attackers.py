"""A fixed set of attackers (`--attack_fixed`, the papers' setting): the clients that
attack are the same in every round and cohort, drawn from (seed, client); TFF's
anonymous clients cannot give one, so its factory refuses it in one line."""

import numpy as np
import pytest
import tensorflow as tf

from tff_comp import settings
from tff_comp.config import experiment_config
from tff_comp.learning_process import chain_factory
from tff_comp.ops import aggregators as agg

M, D = 20, 3


def _attackers(attack: agg.Attack, round_num: int, clients: np.ndarray) -> set[int]:
  """The population indices of `clients` that attack in round `round_num`."""
  chain = agg.Chain((attack,), agg.Median()).bind(D)
  x = np.ones((len(clients), D), np.float32)
  sent = chain.encode(
    chain.initial_state(),
    tf.constant(x),
    tf.ones(len(clients)),
    tf.zeros([len(clients), 0]),
    agg.base.client_seeds(7, round_num, tf.constant(clients)),
  )
  return set(clients[sent.values.numpy()[:, 0] < 0].tolist())  # sign flipped: -1


def test_a_fixed_set_attacks_in_every_round_and_cohort():
  everyone = np.arange(M)
  fixed = [_attackers(agg.SignFlip(0.3, fixed=True), r, everyone) for r in range(1, 5)]
  assert fixed[0] and all(f == fixed[0] for f in fixed)
  part = everyone[::2]  # another cohort: its members as in the whole population
  assert _attackers(agg.SignFlip(0.3, fixed=True), 9, part) == fixed[0] & set(part.tolist())
  redrawn = [_attackers(agg.SignFlip(0.3), r, everyone) for r in range(1, 5)]
  assert len({frozenset(r) for r in redrawn}) > 1


def test_tffs_anonymous_clients_cannot_hold_a_fixed_set():
  with pytest.raises(ValueError, match="follows each client across rounds .* TFF's anonymous"):
    chain_factory.ChainFactory(agg.Chain((agg.SignFlip(0.3, fixed=True),), agg.Median()))


def test_the_flag_applies_to_attacks_on_updates_only():
  config = experiment_config.ExperimentConfig.of(
    algorithm='fedavg', task='lasso', attack='label_flip', attack_fixed=True
  )
  assert settings.ignored_settings(config.aggregation, config.value).startswith(
    '--attack_fixed applies with --attack=alie, gaussian, ipm, mimic, scaled, sign_flip'
  )
