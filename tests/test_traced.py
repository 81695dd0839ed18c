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


def test_arguments_as_traced_skip_binding_and_others_are_bound(monkeypatch):
  """Eager tensors of the trace's dtypes and shapes and its Python values go straight to
  the concrete function's flat call (binding cost 235 us a round of 20 tensors); any
  other argument (a fixed dimension changed, another Python value, a NumPy array) is
  bound as before: traced anew where it does not bind, converted where it does."""
  fn = traced.OnceTraced(lambda x, y, n: (x * 2 + tf.reduce_sum(y), n))
  concrete = fn.trace(
    'key', tf.TensorSpec([None], tf.float32), tf.TensorSpec([2, 3], tf.float32), 3
  )
  bound, call = [], type(concrete).__call__
  monkeypatch.setattr(
    type(concrete), '__call__', lambda self, *a, **k: bound.append(a) or call(self, *a, **k)
  )
  y = tf.ones([2, 3])
  for size in (1, 5):
    doubled, n = fn('key', tf.ones([size]), y, 3)
    np.testing.assert_array_equal(doubled.numpy(), np.full(size, 8.0, np.float32))
    assert n == 3
  assert not bound and fn.function.experimental_get_tracing_count() == 1
  fn('key', tf.ones([2]), np.ones([2, 3], np.float32), 3)  # converted by binding
  assert len(bound) == 1 and fn.function.experimental_get_tracing_count() == 1
  doubled, _ = fn('key', tf.ones([2]), tf.ones([2, 4]), 3)  # another shape: a new trace
  np.testing.assert_array_equal(doubled.numpy(), [10.0, 10.0])
  assert fn.function.experimental_get_tracing_count() == 2
  _, n = fn('key', tf.ones([2]), tf.ones([2, 4]), 4)  # another value: a new trace
  assert n == 4 and fn.function.experimental_get_tracing_count() == 3
