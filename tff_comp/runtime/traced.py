"""A round's `tf.function`, traced once for cohorts of every size and called through
that trace.

Why not call the `tf.function` itself: its dispatch matches every argument's trace
type against its traces on every call (a runtime-checkable protocol check per leaf of
the state), which took about a third of lasso's in-process round; a concrete function
only binds the arguments. Even binding casts each leaf through its trace type, which
took three times as long as the call itself for 20 tensors. So arguments that are what
the trace took (eager tensors of its dtypes and shapes, its Python values) go straight
to the concrete function's flat call.
"""

from collections.abc import Callable, Hashable
from typing import Any

import tensorflow as tf

# TensorFlow's eager tensor class, not exported (its type found without making a tensor,
# which would start TensorFlow's runtime at import, before its threads can be set).
from tensorflow.python.framework.ops import EagerTensor as _EagerTensor


class _FlatCall:
  """A concrete function called with its tensors flat: `tensors(args)` is the list its
  flat call takes, or None for arguments that are not what it was traced for (then
  the concrete function binds them, or they get a trace of their own)."""

  def __init__(self, concrete):
    self._concrete = concrete
    args, kwargs = concrete.structured_input_signature
    leaves = tf.nest.flatten((args, kwargs))
    # Per leaf: (dtype, shape) for a tensor, where a shape with a None dimension keeps
    # only its rank and known dimensions; a Python value is compared by equality.
    self._leaves = []
    for leaf in leaves:
      if isinstance(leaf, tf.TensorSpec):
        shape = tuple(leaf.shape.as_list()) if leaf.shape.rank is not None else None
        self._leaves.append((True, leaf.dtype, shape, shape is not None and None in shape))
      elif isinstance(leaf, (tf.TypeSpec, tf.Tensor, tf.Variable)):
        self._leaves = None  # a composite or variable: always bound
        return
      else:
        self._leaves.append((False, leaf, None, False))

  def tensors(self, args) -> list[tf.Tensor] | None:
    if self._leaves is None:
      return None
    flat = tf.nest.flatten((args, {}))
    if len(flat) != len(self._leaves):
      return None
    tensors = []
    for value, (is_tensor, spec, shape, partial) in zip(flat, self._leaves):
      if not is_tensor:
        if type(value) is not type(spec) or value != spec:
          return None
        continue
      if type(value) is not _EagerTensor or value.dtype != spec:
        return None
      if shape is not None:
        got = value._shape_tuple()
        if partial:
          if len(got) != len(shape) or any(
            want is not None and want != have for want, have in zip(shape, got)
          ):
            return None
        elif got != shape:
          return None
      tensors.append(value)
    return tensors

  def __call__(self, tensors: list[tf.Tensor]) -> Any:
    # The concrete function's own call after binding (TF 2.14's `_call_flat`).
    return self._concrete._call_flat(tensors, self._concrete.captured_inputs)


class OnceTraced:
  """`fn` as a `tf.function` (without AutoGraph), called through one concrete function
  per key. Arguments that do not bind to it (another structure, dtype or shape) get the
  `tf.function`'s concrete function for them (traced anew, which tests counting traces
  see), the key's from then on."""

  def __init__(self, fn: Callable[..., Any]):
    self.function = tf.function(fn, autograph=False)
    self._concrete: dict[Hashable, Any] = {}
    self._flat: dict[Hashable, _FlatCall] = {}

  def traced(self, key: Hashable) -> bool:
    return key in self._concrete

  def trace(self, key: Hashable, *specs) -> Any:
    """Traces for `specs` (TensorSpecs, or values) under `key`; its concrete function."""
    self._concrete[key] = self.function.get_concrete_function(*specs)
    self._flat[key] = _FlatCall(self._concrete[key])
    return self._concrete[key]

  def __call__(self, key: Hashable, *args) -> Any:
    flat = self._flat.get(key)
    if flat is not None:
      tensors = flat.tensors(args)
      if tensors is not None:
        return flat(tensors)
    try:
      return self._concrete[key](*args)
    except TypeError as error:
      if not str(error).startswith('Binding inputs to tf.function failed'):
        raise
    return self.trace(key, *args)(*args)
