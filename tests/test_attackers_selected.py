"""How often a selection rule picks an attacker (`attackers_selected`): the share of the
rows Krum, Multi-Krum and Bulyan choose that an attack stage forged, against the choices
a NumPy reference makes on the same sent rows (the forged ones found by comparing them
with the honest ones); after bucketing and nearest-neighbour mixing, the attackers'
share of the chosen mixed rows' members; the same on TFF's runtime and across shares
summed apart (Ray's); absent where it would mean nothing."""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tests import numpy_reference
from tff_comp.learning_process import chain_factory
import tff_comp.ops.aggregators as agg
from tff_comp.runtime.inprocess import stages

M, D = 12, 6


def _cohort(seed: int) -> tuple[np.ndarray, np.ndarray]:
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(M, D)) * rng.uniform(0.3, 2.0, size=(M, 1)) + 0.5
  seeds = np.stack([np.full(M, seed), np.arange(M) + 50], 1)
  return x.astype(np.float32), seeds.astype(np.int64)


def _round(chain: agg.Chain, seed: int):
  """(the sent rows, which were forged, the round's measurements)."""
  chain = chain.bind(D)
  x, seeds = _cohort(seed)
  state = chain.initial_state()
  encoded = chain.encode(state, tf.constant(x), tf.ones([M]), tf.zeros([M, 0]), seeds)
  _, _, measured = chain.finish(state, chain.sums(state, encoded), agg.round_seed(seed, 1))
  sent = encoded.values.numpy()
  return sent, np.any(sent != x, axis=1), measured


ATTACKS = {'sign_flip': agg.SignFlip(0.4), 'alie': agg.ALIE(0.4)}
RULES = {
  'krum': (agg.Krum(3), lambda x: numpy_reference.krum_chosen(x, 3, 1)),
  'multi_krum': (agg.Krum(3, select=4), lambda x: numpy_reference.krum_chosen(x, 3, 4)),
  'bulyan': (agg.Bulyan(2), lambda x: numpy_reference.bulyan_chosen(x, 2)),
}


@pytest.mark.parametrize('rule', sorted(RULES))
def test_the_share_of_attackers_among_the_rows_a_rule_chose(rule):
  combiner, chosen_by = RULES[rule]
  seen = set()
  for attack in sorted(ATTACKS):
    for seed in range(4):
      sent, forged, measured = _round(agg.Chain((ATTACKS[attack],), combiner), seed)
      want = forged[chosen_by(sent.astype(np.float64))].mean()
      assert float(measured['attackers_selected']) == pytest.approx(want, abs=1e-6), (attack, seed)
      assert 'rows_selected' not in measured
      seen.add(round(want, 6))
  assert len(seen) > 1  # ALIE's rows are chosen more than sign flips'


def test_after_bucketing_each_bucket_counts_its_attackers_share():
  bucketing = agg.Bucketing(2)
  chain = agg.Chain((agg.ALIE(0.4),), agg.Krum(1, select=2), bucketing)
  for seed in range(3):
    sent, forged, measured = _round(chain, seed)
    stream = agg.base._fold(agg.round_seed(seed, 1), 2)  # the mix's, after one stage
    order = bucketing.permutation(M, stream).numpy()
    means = [sent[order[i : i + 2]].mean(0) for i in range(0, M, 2)]
    shares = [forged[order[i : i + 2]].mean() for i in range(0, M, 2)]
    chosen = numpy_reference.krum_chosen(np.array(means, np.float64), 1, 2)
    assert float(measured['attackers_selected']) == pytest.approx(np.mean(np.take(shares, chosen)))


@pytest.mark.parametrize('attack', sorted(ATTACKS))
def test_after_nnm_each_mixed_row_counts_its_neighbours_attackers(attack):
  chain = agg.Chain((ATTACKS[attack],), agg.Krum(3, select=4), agg.NearestNeighbourMixing(3))
  for seed in range(3):
    sent, forged, measured = _round(chain, seed)
    mixed = numpy_reference.nnm(sent, 3)
    shares = []
    for i in numpy_reference.krum_chosen(mixed.astype(np.float64), 3, 4):
      distances = np.linalg.norm(sent.astype(np.float64) - sent[i], axis=1)
      shares.append(forged[np.argsort(distances, kind='stable')[: M - 3]].mean())
    assert float(measured['attackers_selected']) == pytest.approx(np.mean(shares))


@pytest.mark.parametrize(
  'chain',
  [
    agg.Chain((agg.SignFlip(0.4),), agg.Median()),  # not a selection rule
    agg.Chain((), agg.Krum(1)),  # no attack stage
    agg.Chain((agg.SignFlip(0.4),), agg.Mean()),  # decomposable: no rows kept
  ],
  ids=['median', 'no-attack', 'mean'],
)
def test_absent_where_it_would_mean_nothing(chain):
  _, _, measured = _round(chain, 0)
  assert 'attackers_selected' not in measured and 'rows_selected' not in measured


def test_shares_summed_apart_keep_each_rows_mark():
  """Ray's actors each sum a share of the cohort; the round's end reads the rows (and
  their marks) concatenated in share order, as one cohort's."""
  chain = agg.Chain((agg.SignFlip(0.4),), agg.Krum(1, select=3)).bind(D)
  x, seeds = _cohort(2)
  state = chain.initial_state()

  def sums(rows):
    n = len(x[rows])
    encoded = chain.encode(state, x[rows], tf.ones([n]), tf.zeros([n, 0]), seeds[rows])
    summed = tf.nest.map_structure(np.asarray, chain.sums(state, encoded))
    return stages.RoundSums((), summed, ())

  whole = sums(slice(None)).model
  total = stages.add_sums([sums(slice(0, 4)), sums(slice(4, 8)), sums(slice(8, 12))]).model
  np.testing.assert_array_equal(total.marks, whole.marks)
  assert 0 < total.marks.sum() < M
  _, _, apart = chain.finish(state, total, agg.round_seed(2, 1))
  _, _, together = chain.finish(state, whole, agg.round_seed(2, 1))
  assert float(apart['attackers_selected']) == float(together['attackers_selected'])


def test_tffs_runtime_gathers_the_marks_with_the_rows():
  """TFF's clients are anonymous (their draws come from their values), so every one
  attacks or none: Multi-Krum's chosen rows are all forged, or none."""
  value_type = tff.TensorType(np.float32, [D])
  rows = [np.asarray(r) for r in _cohort(0)[0]]
  for fraction, want in ((1.0, 1.0), (0.0, 0.0)):
    chain = agg.Chain((agg.SignFlip(fraction),), agg.Krum(2, select=3))
    process = chain_factory.ChainFactory(chain).create(value_type, tff.TensorType(np.float32))
    out = process.next(process.initialize(), rows, [1.0] * M)
    assert out.measurements['attackers_selected'] == want
    assert out.measurements['byzantine_clients'] == want * M
    assert isinstance(out.measurements, collections.OrderedDict)
