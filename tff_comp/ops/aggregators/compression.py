"""Compression stages: what a client sends in fewer bits, simulated by the value the
server reconstructs (each stage's `upload_bits` says what would travel).

    Rotate     x <- H D x / sqrt(D) with x zero-padded to D = 2^ceil(log2 d), D a random
               +-1 diagonal drawn per round (the server's state, broadcast) and H the
               Walsh-Hadamard matrix; the server rotates the combined vector back
               (Suresh et al. 2017; TFF's HadamardTransformFactory)
    Quantize   b-bit stochastic uniform quantization of each row between its min and
               max: t = (x - lo) (2^b - 1) / (hi - lo), x' = lo + (floor(t) +
               Bernoulli(t - floor(t))) (hi - lo) / (2^b - 1); unbiased
               (b d + 64 bits; TFF's uniform quantization)
    QSGD       x' = ||x|| sign(x) xi / s, xi = floor(s |x| / ||x||) + Bernoulli(frac),
               s levels (Alistarh et al. 2017; (1 + log2(s + 1)) d + 32 bits)
    TopK       the k = max(1, round(f d)) largest |x_j| kept, the rest 0
               (k (32 + log2 d) bits)
    RandK      k coordinates drawn per client and round kept, scaled by d / k when
               `unbiased` (k (32 + log2 d) bits, the indices from the shared seed: 32 k)
    Sign       x' = (||x||_1 / d) sign(x) (scaled sign; d + 32 bits); with the
               MajorityVote combiner, signSGD with majority vote
    ErrorFeedback(C)
               EF (Karimireddy et al. 2019): p = x + e_i, send C(p), e_i <- p - C(p);
               EF21 (Richtarik et al. 2021): send c = C(x - g_i), g_i <- g_i + c, and
               the server's g <- g + combined(c); e_i, g_i kept per client (d floats).
               Both need C contractive, E||C(x) - x||^2 <= (1 - delta) ||x||^2: TopK
               (delta = k/d), Sign (1/d) and unscaled RandK (k/d) are; RandK scaled by
               d/k, QSGD and Quantize are not (a residual grew to 1e3-1e12 with them)

Random draws come from each client's stateless seed (run, round, client), so a client's
encoding is the same on every runtime and in any cohort. Each compressor registers what
`--compression` calls it (`registry.register_compressor`) with its settings record.
"""

import dataclasses
import math
from typing import Any

import tensorflow as tf

from tff_comp import registry, settings
from tff_comp.ops import stateless
from tff_comp.ops.aggregators import base


def _index_bits(d: int) -> float:
  return float(max(1, math.ceil(math.log2(max(d, 2)))))


class Rotate(base.Stage):
  """The randomized Hadamard rotation (module docstring)."""

  name = 'rotate'
  randomized = True
  worth_compiling = True

  def __init__(self, d: int | None = None):
    self.d = d
    self.padded = None if d is None else self.output_size(d)

  def bind(self, d: int) -> 'Rotate':
    return Rotate(d)

  def initial_state(self) -> tuple[tf.Tensor, tf.Tensor]:
    """(the round's sign seed, advanced each round; its signs D). The server draws the
    signs and the clients read them: TensorFlow's stateless random ops draw other bits
    under XLA, which compiles the clients' encodes (`runtime.inprocess.stages`)."""
    if self.padded is None:
      raise ValueError("a rotation is bound to its rows' length first (Chain.bind).")
    seed = tf.constant([0x5EED, 0], tf.int64)
    return seed, self._signs(seed)

  def _signs(self, seed: tf.Tensor) -> tf.Tensor:
    return tf.sign(tf.random.stateless_uniform([self.padded], seed) - 0.5)

  def encode(self, state, x, weights, rows, seeds):
    padded = tf.pad(x, [[0, 0], [0, self.padded - self.d]])
    return base.Encoded(hadamard(padded * state[1][None, :]), weights, rows, {})

  def decode(self, state, y, counts, context, seed):
    back = hadamard(y[None, :])[0] * state[1]
    following = state[0] + tf.constant([0, 1], tf.int64)
    return back[: self.d], (following, self._signs(following)), base.Measurements()

  def output_size(self, d: int) -> int:
    return 2 ** max(0, math.ceil(math.log2(max(d, 1))))

  def upload_bits(self, d, bits):
    return bits * self.output_size(d) / d


# The largest Walsh-Hadamard factor `hadamard` multiplies by: H_D = H_a (x) H_b (x) ...
# (Sylvester's construction), each factor at most 2^6 wide.
_FACTOR_BITS = 6


def _sylvester(size: int) -> tf.Tensor:
  """The unnormalized Walsh-Hadamard matrix of `size` (a power of two), entry (i, j)
  (-1)^popcount(i & j); built by ops a graph folds to a constant of size^2 floats."""
  i = tf.range(size)
  parity = tf.raw_ops.PopulationCount(x=tf.bitwise.bitwise_and(i[:, None], i[None, :])) % 2
  return 1.0 - 2.0 * tf.cast(parity, tf.float32)


def hadamard(x: tf.Tensor) -> tf.Tensor:
  """The normalized Walsh-Hadamard transform of each row of `x` [m, D], D a power of two
  (its own inverse). H_D is the Kronecker product of factors of at most 64 (Sylvester's
  construction), one matrix product each: for D up to 4,096 a row X [a, b] becomes
  H_a X H_b, 5 ops where the butterfly's log2(D) stages of reshapes and slices took 70,
  which a round outside XLA pays as op dispatch (docs/speed.md, part 9); the products'
  extra arithmetic (at most 64 flops a value a factor) is microseconds at these widths."""
  m, size = tf.shape(x)[0], x.shape[1]
  bits = int(math.log2(size))
  if bits <= 2 * _FACTOR_BITS:
    a = 2 ** (bits // 2)
    # One row (the server's decode) as [a, b] between two plain matrix products: as
    # graph ops, a batched product broadcasting H_a took 136 us on lasso's 2,048 values
    # and the plain ones 38 us (oneDNN's batched kernel costs more to start than to run).
    shape = [a, size // a] if x.shape[0] == 1 else [m, a, size // a]
    y = tf.matmul(tf.matmul(_sylvester(a), tf.reshape(x, shape)), _sylvester(size // a))
    return tf.reshape(y, [m, size]) / math.sqrt(size)
  factors = [_FACTOR_BITS] * (bits // _FACTOR_BITS) + [bits % _FACTOR_BITS] * bool(
    bits % _FACTOR_BITS
  )
  y = tf.reshape(x, [m, *(2**f for f in factors)])
  axes = 'abcdefgh'[: len(factors)]
  for f in factors:  # the first factor's axis transformed, moved last: in order at the end
    y = tf.einsum(f'm{axes},{axes[0]}z->m{axes[1:]}z', y, _sylvester(2**f))
  return tf.reshape(y, [m, size]) / math.sqrt(size)


class Quantize(base.Stage):
  """b-bit stochastic uniform quantization per row (module docstring)."""

  name = 'quantize'
  randomized = True
  worth_compiling = True  # its draws: a hash a value

  def __init__(self, bits: int = 8):
    if not 1 <= bits <= 16:
      raise ValueError(f'quantization takes 1 to 16 bits, got {bits}.')
    self.bits = bits

  def encode(self, state, x, weights, rows, seeds):
    lo = tf.reduce_min(x, 1, keepdims=True)
    span = tf.reduce_max(x, 1, keepdims=True) - lo
    levels = float(2**self.bits - 1)
    t = tf.math.divide_no_nan(x - lo, span) * levels
    low = tf.floor(t)
    q = low + tf.cast(stateless.row_uniform(seeds, tf.shape(x)[1]) < t - low, tf.float32)
    return base.Encoded(lo + q * span / levels, weights, rows, {})

  def upload_bits(self, d, bits):
    return bits / 32.0 * self.bits + 64.0


class QSGD(base.Stage):
  """QSGD with `levels` s (module docstring)."""

  name = 'qsgd'
  randomized = True
  worth_compiling = True  # its draws: a hash a value

  def __init__(self, levels: int = 16):
    if levels < 1:
      raise ValueError(f'QSGD needs levels >= 1, got {levels}.')
    self.levels = levels

  def encode(self, state, x, weights, rows, seeds):
    norm = tf.norm(x, axis=1, keepdims=True)
    t = tf.math.divide_no_nan(tf.abs(x), norm) * self.levels
    low = tf.floor(t)
    xi = low + tf.cast(stateless.row_uniform(seeds, tf.shape(x)[1]) < t - low, tf.float32)
    return base.Encoded(norm * tf.sign(x) * xi / self.levels, weights, rows, {})

  def upload_bits(self, d, bits):
    return bits / 32.0 * (1.0 + math.log2(self.levels + 1)) + 32.0


def _keep(x: tf.Tensor, scores: tf.Tensor, k: int) -> tf.Tensor:
  """`x` with each row's `k` entries of highest score kept, the others 0."""
  _, indices = tf.math.top_k(scores, k)
  m = tf.shape(x)[0]
  rows = tf.tile(tf.range(m)[:, None], [1, k])
  where = tf.stack([tf.reshape(rows, [-1]), tf.reshape(indices, [-1])], 1)
  mask = tf.scatter_nd(where, tf.ones([m * k]), tf.shape(x))
  return x * mask


class _Sparsify(base.Stage):
  """Keeps k = max(1, round(fraction d)) coordinates of each row."""

  randomized = False

  def __init__(self, fraction: float, d: int | None = None):
    if not 0 < fraction <= 1:
      raise ValueError(f'the kept fraction must be in (0, 1], got {fraction}.')
    self.fraction, self.d = fraction, d
    self.k = None if d is None else max(1, round(fraction * d))

  def bind(self, d: int):
    return type(self)(self.fraction, d=d, **self._options())

  def _options(self) -> dict:
    return {}

  def upload_bits(self, d, bits):
    return self.k * (32.0 + _index_bits(d))


class TopK(_Sparsify):
  """Top-k sparsification (module docstring)."""

  name = 'top_k'
  contractive = True

  def encode(self, state, x, weights, rows, seeds):
    return base.Encoded(_keep(x, tf.abs(x), self.k), weights, rows, {})


class RandK(_Sparsify):
  """Rand-k sparsification (module docstring), scaled by d / k when `unbiased`."""

  name = 'rand_k'
  randomized = True
  worth_compiling = True  # its draws: a hash a value

  def __init__(self, fraction: float, d: int | None = None, unbiased: bool = True):
    super().__init__(fraction, d)
    self.unbiased = unbiased
    self.contractive = not unbiased  # scaled by d/k, the error can exceed ||x||^2

  def _options(self) -> dict:
    return {'unbiased': self.unbiased}

  def for_error_feedback(self) -> 'RandK':
    return RandK(self.fraction, self.d, unbiased=False)

  def encode(self, state, x, weights, rows, seeds):
    kept = _keep(x, stateless.row_uniform(seeds, tf.shape(x)[1]), self.k)
    if self.unbiased:
      kept *= self.d / self.k
    return base.Encoded(kept, weights, rows, {})

  def upload_bits(self, d, bits):
    return self.k * 32.0  # the indices follow from the shared seed


class Sign(base.Stage):
  """The scaled sign (module docstring)."""

  name = 'sign'
  contractive = True  # ||C(x) - x||^2 = ||x||^2 - ||x||_1^2 / d
  votes = True

  def encode(self, state, x, weights, rows, seeds):
    scale = tf.reduce_mean(tf.abs(x), 1, keepdims=True)
    return base.Encoded(scale * tf.sign(x), weights, rows, {})

  def upload_bits(self, d, bits):
    return bits / 32.0 + 32.0


class ErrorFeedback(base.Stage):
  """EF or EF21 around a compression stage (module docstring); `variant` 'ef' or
  'ef21'. Each client keeps d floats (`row_size`); EF21's server keeps g (d floats)."""

  def __init__(self, compressor: base.Stage, variant: str = 'ef', d: int | None = None):
    if variant not in ('ef', 'ef21'):
      raise ValueError(f'error feedback is ef or ef21, got {variant!r}.')
    if compressor.row_size:
      raise ValueError('error feedback wraps a compressor without rows of its own.')
    if not compressor.contractive:
      raise ValueError(
        f'error feedback needs a contractive compressor, and {compressor.name} is not'
        ' (its residuals can grow without bound): use top_k, sign or rand_k unscaled.'
      )
    self.compressor, self.variant, self.d = compressor, variant, d
    self.name = f'{variant}({compressor.name})'
    self.row_size = d or 0
    self.randomized = compressor.randomized
    self.exact_under_xla = compressor.exact_under_xla
    self.worth_compiling = compressor.worth_compiling

  def bind(self, d: int) -> 'ErrorFeedback':
    return ErrorFeedback(self.compressor.bind(d), self.variant, d)

  def initial_state(self):
    inner = self.compressor.initial_state()
    return (inner, tf.zeros([self.d], tf.float32)) if self.variant == 'ef21' else (inner, ())

  def encode(self, state, x, weights, rows, seeds):
    inner = state[0]
    none = rows[:, :0]
    if self.variant == 'ef':
      p = x + rows
      c = self.compressor.encode(inner, p, weights, none, seeds).values
      return base.Encoded(c, weights, p - c, {})
    c = self.compressor.encode(inner, x - rows, weights, none, seeds).values
    return base.Encoded(c, weights, rows + c, {})

  def decode(self, state, y, counts, context, seed):
    y, inner, measured = self.compressor.decode(state[0], y, counts, context, seed)
    if self.variant == 'ef21':
      g = state[1] + y
      return g, (inner, g), measured
    return y, (inner, ()), measured

  def upload_bits(self, d, bits):
    return self.compressor.upload_bits(d, bits)


def hadamard_rotation() -> Any:
  """The setting of the randomized Hadamard rotation before a compressor."""
  return settings.setting(
    False,
    "rotate each update by a randomized Hadamard transform first (TFF's compression;"
    ' the server rotates back).',
  )


def sparsity_fraction() -> Any:
  """The setting of the fraction of coordinates top-k and rand-k send."""
  return settings.setting(0.1, 'the fraction of coordinates sent.', above=0.0, upper=1.0)


@dataclasses.dataclass(frozen=True)
class QuantizeOptions:
  quantize_bits: int = settings.setting(8, 'bits a value.', lower=1, upper=16)
  hadamard_rotation: bool = hadamard_rotation()


@dataclasses.dataclass(frozen=True)
class QSGDOptions:
  qsgd_levels: int = settings.setting(16, 'quantization levels s.', lower=1, upper=2**16)


@dataclasses.dataclass(frozen=True)
class SparsifyOptions:
  sparsity_fraction: float = sparsity_fraction()
  hadamard_rotation: bool = hadamard_rotation()


def _rotated(stage: base.Stage, rotate: bool) -> tuple[base.Stage, ...]:
  return (Rotate(), stage) if rotate else (stage,)


@registry.register_compressor('quantize', options=QuantizeOptions)
def _quantize(options: QuantizeOptions, clients_per_round: int) -> tuple[base.Stage, ...]:
  """Stochastic b-bit uniform quantization (Suresh et al. 2017)."""
  del clients_per_round
  return _rotated(Quantize(options.quantize_bits), options.hadamard_rotation)


@registry.register_compressor('qsgd', options=QSGDOptions)
def _qsgd(options: QSGDOptions, clients_per_round: int) -> tuple[base.Stage, ...]:
  """QSGD's s-level stochastic quantization of the normalized update (Alistarh et al.
  2017)."""
  del clients_per_round
  return (QSGD(options.qsgd_levels),)


@registry.register_compressor('top_k', options=SparsifyOptions)
def _top_k(options: SparsifyOptions, clients_per_round: int) -> tuple[base.Stage, ...]:
  """The largest coordinates kept (Stich et al. 2018)."""
  del clients_per_round
  return _rotated(TopK(options.sparsity_fraction), options.hadamard_rotation)


@registry.register_compressor('rand_k', options=SparsifyOptions)
def _rand_k(options: SparsifyOptions, clients_per_round: int) -> tuple[base.Stage, ...]:
  """Random coordinates kept, scaled by d / k (unscaled under error feedback)."""
  del clients_per_round
  return _rotated(RandK(options.sparsity_fraction), options.hadamard_rotation)


@registry.register_compressor('sign')
def _sign(options: None, clients_per_round: int) -> tuple[base.Stage, ...]:
  """Scaled signs; with --aggregator=mean, signSGD's majority vote (Bernstein et al.
  2019)."""
  del options, clients_per_round
  return (Sign(),)
