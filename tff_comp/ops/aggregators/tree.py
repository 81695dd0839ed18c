"""Tree aggregation's noise: the mechanism of DP-FTRL (Kairouz, McMahan, Song, Thakkar,
Thakurta and Xu 2021, "Practical and Private (Deep) Learning without Sampling or
Shuffling"), as TensorFlow Privacy's `TreeResidualSumQuery` adds it.

The prefix sums S_n = sum_{t <= n} s_t of the rounds' clipped sums are released with the
noise of a binary tree over the rounds: a node (l, k) covers rounds k 2^l + 1 ..
(k + 1) 2^l and holds a fresh Gaussian g(l, k) ~ N(0, sigma^2 I); the noise of S_n is
the sum of the nodes of n's binary decomposition,

    N(n) = sum over the bits l set in n of g(l, floor(n / 2^l) - 1),

so every S_n reads at most log2(n) + 1 nodes, and a client present in one round
changes one node a level. A round releases its residual, S_n + N(n) - (S_{n-1} +
N(n-1)): its sum plus

    N(n) - N(n-1) = g(j, n / 2^j - 1) - sum_{l < j} g(l, (n - 1) / 2^l - 1),

j the trailing zero bits of n. An SGD server step on these residuals at a constant
rate is the FTRL step from the noised prefix sum (the paper's DP-FTRL; its momentum,
DP-FTRLM, the server's momentum on them). Every `restart_every` rounds a new tree
starts (the previous one's noise stays in the model, as TFP's `RestartQuery`).

Node g(l, k) of tree r is drawn from (the run's seed, r, l, k) alone, so no node is
stored: a resumed run draws the nodes it would have drawn. The stage's state is (r, n),
the tree and the rounds it has released.
"""

import tensorflow as tf

from tff_comp.ops.aggregators import base


def node(key: tf.Tensor, tree: tf.Tensor, level: tf.Tensor, index: tf.Tensor, shape) -> tf.Tensor:
  """g(level, index) of tree `tree`, N(0, I) of `shape`, from the run's `key` [2]."""
  seed = key
  for value in (tree, level, index):
    seed = tf.random.experimental.stateless_fold_in(seed, tf.cast(value, tf.int64))
  return tf.random.stateless_normal(shape, seed)


def prefix_noise(key, tree, n, shape) -> tf.Tensor:
  """N(n): the noise of the prefix sum of rounds 1..n (module docstring), unit std."""
  n = tf.cast(n, tf.int64)

  def body(level, total):
    bit = tf.bitwise.bitwise_and(tf.bitwise.right_shift(n, level), 1)
    g = node(key, tree, level, tf.bitwise.right_shift(n, level) - 1, shape)
    return level + 1, total + tf.cast(bit, tf.float32) * g

  _, total = tf.while_loop(
    lambda level, _: tf.bitwise.right_shift(n, level) > 0,
    body,
    (tf.constant(0, tf.int64), tf.zeros(shape)),
  )
  return total


def residual_noise(key, tree, n, shape) -> tf.Tensor:
  """N(n) - N(n - 1) for n >= 1, unit std: j + 1 nodes, j the trailing zeros of n."""
  n = tf.cast(n, tf.int64)
  lowest = tf.bitwise.bitwise_and(n, -n)  # 2^j
  j = tf.cast(tf.raw_ops.PopulationCount(x=lowest - 1), tf.int64)
  top = node(key, tree, j, tf.bitwise.right_shift(n, j) - 1, shape)

  def body(level, total):
    g = node(key, tree, level, tf.bitwise.right_shift(n - 1, level) - 1, shape)
    return level + 1, total - g

  _, total = tf.while_loop(lambda level, _: level < j, body, (tf.constant(0, tf.int64), top))
  return total


class TreeNoise(base.Stage):
  """The tree's residual noise of std `stddev` a node (z C: the noise multiplier
  times the clip norm) added to the combined sum before the combiner's scaling; a new
  tree every `restart_every` rounds (0: one tree). Module docstring."""

  name = 'tree_noise'
  randomized = True

  def __init__(self, stddev: float, *, restart_every: int = 0):
    if not stddev >= 0:
      raise ValueError(f"the tree's noise std must be >= 0, got {stddev}.")
    if not restart_every >= 0:
      raise ValueError(f'restart_every must be >= 0, got {restart_every}.')
    self.stddev, self.restart_every = stddev, restart_every

  def initial_state(self) -> tf.Tensor:
    """[tree r, rounds released in it n], int64."""
    return tf.zeros([2], tf.int64)

  def decode(self, state, y, counts, context, seed):
    tree, n = state[0], state[1] + 1
    # The run's key: a decode's seed is (run seed + salt, a round- and stream-dependent
    # second word), and a tree's nodes must not depend on the round that draws them.
    key = tf.stack([seed[0], tf.constant(0x7EE, tf.int64)])
    noise = residual_noise(key, tree, n, tf.shape(y))
    y = y + self.stddev * noise * context.scale
    if self.restart_every:
      restart = n >= self.restart_every
      state = tf.stack([tf.where(restart, tree + 1, tree), tf.where(restart, tf.zeros_like(n), n)])
    else:
      state = tf.stack([tree, n])
    return y, state, base.Measurements(tree_round=n)

  def why_not(self, chain) -> str:
    return base.noises_a_sum(chain, 'tree aggregation')
