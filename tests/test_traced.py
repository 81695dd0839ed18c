"""`runtime.traced.OnceTraced`: rounds run through the key's concrete function (never
the `tf.function`'s own dispatch, which matches every argument's trace type on every
call); one trace serves every cohort size; arguments that do not bind to it get a trace
of their own, once."""

import numpy as np
import tensorflow as tf

from tff_comp.runtime import traced


class _Dispatches:
  """The `tf.function` of a OnceTraced, counting calls through its own dispatch."""

  def __init__(self, function):
    self._function, self.calls = function, 0

  def __call__(self, *args):
    self.calls += 1
    return self._function(*args)

  def __getattr__(self, name):
    return getattr(self._function, name)


def _double() -> tuple[traced.OnceTraced, _Dispatches]:
  fn = traced.OnceTraced(lambda x, n: (x * 2, n))
  fn.function = _Dispatches(fn.function)
  fn.trace('key', tf.TensorSpec([None], tf.float32), 3)
  return fn, fn.function


def test_one_trace_serves_every_size_through_its_concrete_function():
  fn, dispatches = _double()
  for size in (1, 4, 9):
    doubled, _ = fn('key', tf.ones([size]), 3)
    np.testing.assert_array_equal(doubled.numpy(), np.full(size, 2.0, np.float32))
  assert fn.function.experimental_get_tracing_count() == 1
  assert dispatches.calls == 0


def test_arguments_that_do_not_bind_are_traced_once_and_kept():
  fn, dispatches = _double()
  for _ in range(3):  # float64: the key's trace cannot take them
    doubled, _ = fn('key', tf.constant([1.0, 2.0], tf.float64), 3)
    assert doubled.dtype == tf.float64
  assert fn.function.experimental_get_tracing_count() == 2
  assert dispatches.calls == 0
