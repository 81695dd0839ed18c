"""A round's `tf.function`, traced once for cohorts of every size and called through
that trace.

Why not call the `tf.function` itself: its dispatch matches every argument's trace
type against its traces on every call (a runtime-checkable protocol check per leaf of
the state), which took 0.4 ms of lasso's 1.3 ms in-process round on the project's
2-core machines; a concrete function only binds the arguments (0.84 ms a round).
"""

from collections.abc import Callable, Hashable
from typing import Any

import tensorflow as tf


class OnceTraced:
  """`fn` as a `tf.function` (without AutoGraph), called through one concrete function
  per key. Arguments that do not bind to it (another structure, dtype or shape) get the
  `tf.function`'s concrete function for them (traced anew, which tests counting traces
  see), the key's from then on."""

  def __init__(self, fn: Callable[..., Any]):
    self.function = tf.function(fn, autograph=False)
    self._concrete: dict[Hashable, Any] = {}

  def traced(self, key: Hashable) -> bool:
    return key in self._concrete

  def trace(self, key: Hashable, *specs) -> Any:
    """Traces for `specs` (TensorSpecs, or values) under `key`; its concrete function."""
    self._concrete[key] = self.function.get_concrete_function(*specs)
    return self._concrete[key]

  def __call__(self, key: Hashable, *args) -> Any:
    try:
      return self._concrete[key](*args)
    except TypeError as error:
      if not str(error).startswith('Binding inputs to tf.function failed'):
        raise
    return self.trace(key, *args)(*args)
