"""Ops written so `tf.vectorized_map` vectorizes them when each lane has its own weights.

TensorFlow's vectorization (pfor) converts `Conv2D` only for a filter shared by every
lane ("Input "filter" of op 'Conv2D' expected to be loop invariant"), and its gradient
with respect to a per-lane input falls back to a while loop. JAX's `vmap` turns such a
convolution into one grouped convolution; pfor has no such rule (and a grouped
convolution of the EMNIST CNN's 10 clients under XLA on a CPU took 39x the clients'
own convolutions, measured). `conv2d` here is the convolution as a sum over the
kernel's taps of the input's shifted (strided, dilated) slice times the tap's matrix,
ops pfor vectorizes for per-lane weights, so the lanes engine (XLA, static shapes)
compiles a CNN once; `conv1d` is `conv2d` on a height of 1. Equal to `tf.nn.conv2d`
and `tf.nn.conv1d` (tests/test_vectorizable.py).

`across_lanes()` marks code being traced for the lanes engine; models built with
`keras_models.from_keras` then run their Conv1D and Conv2D layers through these.
"""

from collections.abc import Iterator, Sequence
import contextlib
import threading

import tensorflow as tf

_TRACING = threading.local()


@contextlib.contextmanager
def across_lanes() -> Iterator[None]:
  """Marks the code traced in this context (this thread) as vectorized across lanes."""
  before = getattr(_TRACING, 'lanes', False)
  _TRACING.lanes = True
  try:
    yield
  finally:
    _TRACING.lanes = before


def tracing_across_lanes() -> bool:
  """Whether the current trace is vectorized across lanes (`across_lanes`)."""
  return getattr(_TRACING, 'lanes', False)


def conv2d(
  inputs: tf.Tensor,
  kernel: tf.Tensor,
  strides: Sequence[int] = (1, 1),
  padding: str = 'VALID',
  dilations: Sequence[int] = (1, 1),
) -> tf.Tensor:
  """`tf.nn.conv2d(inputs, kernel, strides, padding, dilations=dilations)` for NHWC
  `inputs` of static spatial shape, as per-tap matmuls (see the module docstring)."""
  kh, kw, channels, filters = kernel.shape
  (sh, sw), (dh, dw) = strides, dilations
  if padding == 'SAME':
    pads = []
    for size, k, s, d in ((inputs.shape[1], kh, sh, dh), (inputs.shape[2], kw, sw, dw)):
      total = max((-(-size // s) - 1) * s + (k - 1) * d + 1 - size, 0)
      pads.append([total // 2, total - total // 2])
    inputs = tf.pad(inputs, [[0, 0], *pads, [0, 0]])
  elif padding != 'VALID':
    raise ValueError(f'padding {padding!r}: only VALID and SAME.')
  height = (inputs.shape[1] - (kh - 1) * dh - 1) // sh + 1
  width = (inputs.shape[2] - (kw - 1) * dw - 1) // sw + 1
  batch = inputs.shape[0] if inputs.shape[0] is not None else -1
  # A sum of one matmul per kernel tap, static shapes throughout: with the taps side by
  # side (tf.concat) and one matmul, the concatenation's gradient made XLA take the
  # lanes' weights as compile-time constants (a compile every round; XLA's
  # const_analysis log).
  rows = 0.0
  for i in range(kh):
    for j in range(kw):
      tap = inputs[
        :,
        i * dh : i * dh + (height - 1) * sh + 1 : sh,
        j * dw : j * dw + (width - 1) * sw + 1 : sw,
        :,
      ]
      rows += tf.reshape(tap, [-1, channels]) @ kernel[i, j]
  return tf.reshape(rows, [batch, height, width, filters])


def conv1d(
  inputs: tf.Tensor, kernel: tf.Tensor, stride: int = 1, padding: str = 'VALID', dilation: int = 1
) -> tf.Tensor:
  """`tf.nn.conv1d(inputs, kernel, stride, padding, dilations=dilation)` for NWC `inputs`
  of static width, as `conv2d` over a height of 1."""
  return conv2d(inputs[:, None], kernel[None], (1, stride), padding, (1, dilation))[:, 0]
