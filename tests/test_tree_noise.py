"""Tree aggregation's noise (`ops.aggregators.tree`, DP-FTRL's mechanism) against
TensorFlow Privacy's: its `TreeAggregator`, driven by a generator that hands it our
nodes in the order it asks for them, gives our prefix noise; TFF's
`DifferentiallyPrivateFactory` on a `TreeResidualSumQuery` with the same nodes gives our
chain's rounds; the nodes are independent N(0, 1) draws, of a new tree after a restart."""

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
from tensorflow_privacy.privacy.dp_query import (
  normalized_query,
  tree_aggregation,
  tree_aggregation_query,
)

import tff_comp.ops.aggregators as agg
from tff_comp.ops.aggregators import base, tree

KEY = tf.constant([11, 0x7EE], tf.int64)
ZERO = tf.constant(0, tf.int64)


class _OurNodes(tree_aggregation.ValueGenerator):
  """Node after node in the order TFP's (non-efficient) tree creates them: its c-th
  node completes the prefix of c + 1 rounds, at level j = the trailing zeros of c + 1."""

  def __init__(self, key, shape, stddev=1.0):
    self.key, self.shape, self.stddev = key, shape, stddev

  def initialize(self):
    return tf.constant(0, tf.int64)

  def next(self, c):
    m = c + 1
    j = tf.cast(tf.raw_ops.PopulationCount(x=tf.bitwise.bitwise_and(m, -m) - 1), tf.int64)
    key = tf.constant(self.key, tf.int64)  # built in the graph TFF traces
    g = tree.node(key, 0, j, tf.bitwise.right_shift(m, j) - 1, self.shape)
    return [self.stddev * g], c + 1  # as the queries' record specs: a list


def test_prefix_and_residual_noise_are_tfps_tree_of_the_same_nodes():
  aggregator = tree_aggregation.TreeAggregator(_OurNodes(KEY, [3]))
  state, previous = aggregator.init_state(), np.zeros(3, np.float32)
  for n in range(1, 41):
    (cumsum,), state = aggregator.get_cumsum_and_update(state)
    np.testing.assert_allclose(tree.prefix_noise(KEY, ZERO, n, [3]), cumsum, atol=1e-6)
    np.testing.assert_allclose(
      tree.residual_noise(KEY, ZERO, n, [3]), cumsum - previous, atol=2e-6, err_msg=f'n={n}'
    )
    previous = cumsum.numpy()


def test_residual_noise_has_one_node_a_level_below_the_lowest_bit_and_new_trees_are_new():
  d = 20_000
  for n, nodes in ((1, 1), (2, 2), (3, 1), (8, 4), (12, 3)):
    variance = np.var(tree.residual_noise(KEY, ZERO, n, [d]))
    assert abs(variance - nodes) < 0.06 * nodes, (n, variance)
  first = tree.residual_noise(KEY, ZERO, 5, [d])
  second = tree.residual_noise(KEY, tf.constant(1, tf.int64), 5, [d])
  assert abs(np.corrcoef(first, second)[0, 1]) < 0.03


def _client_rows(rounds, m, d):
  rng = np.random.default_rng(0)
  return [rng.normal(size=(m, d)).astype(np.float32) * 3 for _ in range(rounds)]


def test_the_chain_is_tffs_tree_aggregation_factory_on_the_same_nodes():
  """Clip, the tree's residual noise, the sum over n: TFF's DP factory on TFP's
  `TreeResidualSumQuery`, whose generator draws our nodes (std z C)."""
  z, clip, n, d, rounds, run_seed = 0.7, 2.0, 4.0, 6, 9, 5
  chain = agg.Chain((agg.Clip(clip), tree.TreeNoise(z * clip)), agg.Mean(denominator=n))
  key = [int(base.round_seed(run_seed, 1)[0]), 0x7EE]
  query = tree_aggregation_query.TreeResidualSumQuery(
    clip_fn=lambda record, c: tf.clip_by_global_norm(record, c)[0],
    clip_value=clip,
    noise_generator=_OurNodes(key, [d], z * clip),
    record_specs=[tf.TensorSpec([d], tf.float32)],
    use_efficient=False,
  )
  factory = tff.aggregators.DifferentiallyPrivateFactory(
    normalized_query.NormalizedQuery(query, denominator=n)
  )
  process = factory.create(tff.types.tensorflow_to_type([tf.TensorSpec([d], tf.float32)]))
  tff_state, state = process.initialize(), chain.initial_state()
  for round_num, x in enumerate(_client_rows(rounds, 3, d), 1):
    got, _, state, _ = chain.aggregate(
      state,
      tf.constant(x),
      tf.ones([3]),
      tf.zeros([3, 0]),
      base.client_seeds(run_seed, round_num, tf.range(3)),
      base.round_seed(run_seed, round_num),
    )
    output = process.next(tff_state, [[row] for row in x])
    tff_state = output.state
    np.testing.assert_allclose(got, output.result[0], rtol=1e-5, atol=1e-5, err_msg=f'{round_num}')


def test_a_restart_starts_a_new_tree_from_no_noise():
  """With restart_every=k, round k + 1 releases the new tree's first node alone, as
  TFP's RestartQuery resets the previous noise to zero."""
  stage = tree.TreeNoise(1.0, restart_every=3)
  context = base.Context(tf.constant(1.0), tf.constant(1.0), tf.constant(1.0))
  seed, state, released = base.round_seed(5, 1), stage.initial_state(), []
  for _ in range(5):
    y, state, _ = stage.decode(state, tf.zeros([4]), {}, context, seed)
    released.append(y.numpy())
  key = tf.stack([seed[0], tf.constant(0x7EE, tf.int64)])
  one = tf.constant(1, tf.int64)
  np.testing.assert_allclose(released[3], tree.node(key, one, ZERO, ZERO, [4]), atol=1e-6)
  np.testing.assert_allclose(sum(released[3:]), tree.prefix_noise(key, one, 2, [4]), atol=1e-5)
  np.testing.assert_allclose(sum(released[:3]), tree.prefix_noise(key, ZERO, 3, [4]), atol=1e-5)
  np.testing.assert_array_equal(state, [1, 2])
