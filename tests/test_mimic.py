"""The mimic attack (Karimireddy, He and Jaggi 2022) against NumPy written from the
paper: every attacker copies the honest update farthest from the honest mean along the
honest updates' top principal direction."""

import numpy as np
import tensorflow as tf

from tff_comp.config import aggregation_settings
from tff_comp.ops import aggregators as agg

M, D = 12, 6


def _sent(attack: agg.Attack, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(the rows sent, who attacked) in one round."""
  chain = agg.Chain((attack,), agg.Median()).bind(D)
  seeds = agg.base.client_seeds(4, 2, tf.range(M))
  sent = chain.encode(chain.initial_state(), tf.constant(x), tf.ones(M), tf.zeros([M, 0]), seeds)
  return sent.values.numpy(), sent.counts['0/attackers'].numpy() > 0


def _reference_target(x: np.ndarray, bad: np.ndarray) -> int:
  honest = x[~bad]
  centered = honest - honest.mean(0)
  _, vectors = np.linalg.eigh(centered.T @ centered)
  return int(np.flatnonzero(~bad)[np.argmax(np.abs(centered @ vectors[:, -1]))])


def test_every_attacker_copies_the_honest_row_farthest_along_the_top_direction():
  rng = np.random.default_rng(0)
  for trial in range(5):
    # Anisotropic rows, so the top direction is well separated from the next.
    x = (rng.normal(size=(M, D)) * np.array([3.0, 1.0, 0.5, 0.3, 0.2, 0.1])).astype(np.float32)
    x = x @ np.linalg.qr(rng.normal(size=(D, D)))[0].astype(np.float32) + 1.0
    sent, bad = _sent(agg.Mimic(0.3), x)
    assert 0 < bad.sum() < M, trial
    np.testing.assert_array_equal(sent[~bad], x[~bad])
    target = _reference_target(x, bad)
    np.testing.assert_allclose(sent[bad], np.tile(x[target], (bad.sum(), 1)), rtol=1e-6)


def test_an_attacker_never_copies_another_attackers_own_update():
  """The attackers' own rows (here far out along the top direction) are not candidates."""
  x = np.random.default_rng(3).normal(size=(M, D)).astype(np.float32)
  _, bad = _sent(agg.Mimic(0.3), x)
  x[bad, 0] = 100.0  # their own updates, were they counted, would be the farthest
  sent, _ = _sent(agg.Mimic(0.3), x)
  copied = np.flatnonzero((x == sent[bad][0]).all(1))
  assert not bad[copied].any() and copied[0] == _reference_target(x, bad)


def test_the_flag_builds_it():
  options = aggregation_settings.AggregationOptions(
    aggregator='krum', attack='mimic', attack_fraction=0.2, attack_fixed=True
  )
  attack = options.chain(None, 10).stages[0]
  assert isinstance(attack, agg.Mimic) and attack.fraction == 0.2 and attack.fixed
