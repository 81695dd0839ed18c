"""Keras models as pure functions of their weights, for every runtime.

`from_keras(model, loss, input_spec)` gives a `tff.learning.models.FunctionalModel`
whose `predict_on_batch(weights, x)` calls the Keras model with the given weight tensors
in place of its variables: each layer's attribute holding a variable (Dense.kernel,
Conv2D.bias, LSTMCell.recurrent_kernel, ...) is pointed at the tensor for the call and
restored after it. Nothing is imported into a graph (TFF's
`functional_model_from_keras` imports the model's graph, so it runs only inside TFF
computations): the function traces inside the in-process round's `tf.function`,
differentiates twice (MAML) and vectorizes (`tf.vectorized_map`) where the layers' ops
do (Conv1D and Conv2D layers through `ops.vectorizable` when traced for the lanes
engine), and it runs inside TFF's computations too.

Non-trainable weights (a frozen layer's, an adapted Normalization's statistics) are the
model's non-trainable weights, passed through unchanged. Dropout (and SpatialDropout)
layers draw their masks statelessly from a seed computed from the call's batch
(`_batch_seed`), so the function stays pure: every runtime draws the same masks. (A seed
from the weights' bits, as before 0.4, drew other masks wherever two runtimes' weights
differed in their last bit, as the worker's and the in-process engines' do on some
CPUs.) Local shuffling (the default) gives each step other batches, hence other masks;
without it a client's batch gets the same masks in every epoch and round.
Refused, naming the layer: layers whose training call updates state
(BatchNormalization: use GroupNormalization or LayerNormalization) and the other layers
drawing random numbers (GaussianNoise, GaussianDropout, AlphaDropout).
"""

from collections.abc import Callable, Sequence
import contextlib
import difflib
import functools
import importlib
import importlib.util
import pathlib
import types
from typing import Any

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_comp.ops import vectorizable

# Layers refused, and what to use instead.
_STATEFUL = {tf.keras.layers.BatchNormalization: 'GroupNormalization or LayerNormalization'}
_RANDOM = (
  tf.keras.layers.GaussianNoise,
  tf.keras.layers.GaussianDropout,
  tf.keras.layers.AlphaDropout,
)


def from_keras(
  model: tf.keras.Model, loss: Callable[[Any, Any], tf.Tensor], input_spec: Any
) -> tff.learning.models.FunctionalModel:
  """`model` (built, with weights) as a FunctionalModel computing `loss(label, output)`
  (a Keras loss or any callable); see the module docstring.

  Raises:
    ValueError: the model is not built, holds a refused layer, or keeps a weight where
      no layer attribute holds it.
  """
  if not model.built or not model.weights:
    raise ValueError(
      'the Keras model has no weights yet: build it (give it an Input or'
      ' call model.build(input_shape)) before converting it.'
    )
  _check_layers(model)
  trainable, non_trainable = list(model.trainable_weights), list(model.non_trainable_weights)
  owners, constants = _owners(model), _eager_tensors(model)
  for variable in trainable + non_trainable:
    if variable.ref() not in owners:
      raise ValueError(
        f'weight {variable.name} is held by no layer attribute, so it cannot'
        ' be substituted; wrap it in a layer that keeps it as an attribute.'
      )
  variables = trainable + non_trainable

  convolutions = [
    layer
    for layer in _layers(model)
    if isinstance(layer, (tf.keras.layers.Conv1D, tf.keras.layers.Conv2D))
    and layer.groups == 1
    and layer.data_format == 'channels_last'
    and not isinstance(layer, (tf.keras.layers.Conv1DTranspose, tf.keras.layers.Conv2DTranspose))
  ]

  dropouts = [layer for layer in _layers(model) if isinstance(layer, tf.keras.layers.Dropout)]

  def predict_on_batch(weights, x, training=True):
    values = [_dense_gradient(w) for w in (*weights[0], *weights[1])]
    seed = _batch_seed(x) if dropouts else None
    # Traced for the lanes engine (`vectorizable.across_lanes`, which traces this
    # function inline: `ops.model_ops.batch_loss`), convolutions as per-tap matmuls.
    across_lanes = convolutions if vectorizable.tracing_across_lanes() else ()
    with (
      _substituted(owners, variables, values, constants),
      _lanes_convolutions(across_lanes),
      _stateless_dropout(dropouts, seed),
    ):
      return model(x, training=training)

  def loss_fn(output, label, sample_weight=None):
    del sample_weight
    return loss(label, output)

  initial = (
    tuple(np.array(v.numpy()) for v in trainable),
    tuple(np.array(v.numpy()) for v in non_trainable),
  )
  # Traced without AutoGraph, as the in-process round (Keras's own call needs none).
  return _KerasModel(
    (model, loss, input_spec),
    initial_weights=initial,
    predict_on_batch_fn=tf.function(predict_on_batch, autograph=False),
    loss_fn=tf.function(loss_fn, autograph=False),
    input_spec=input_spec,
  )


class _KerasModel(tff.learning.models.FunctionalModel):
  """A FunctionalModel that pickles as `from_keras` of its Keras model, loss and input
  spec (`source`; Keras pickles the model) from its initial weights: its substitution
  finds the layers' variables by identity, which a copy of the function would not keep
  (a Ray actor's copy took no gradient)."""

  def __init__(self, source: tuple[Any, Any, Any], **kwargs):
    super().__init__(**kwargs)
    self._source = source

  def __reduce__(self):
    return _converted_from, (*self._source, self.initial_weights)


def _converted_from(model: tf.keras.Model, loss, input_spec, initial) -> '_KerasModel':
  """`from_keras(model, loss, input_spec)` starting from `initial` (a pickled
  `_KerasModel`'s initial weights, whatever the Keras variables held since)."""
  for variable, value in zip(
    [*model.trainable_weights, *model.non_trainable_weights], [*initial[0], *initial[1]]
  ):
    variable.assign(value)
  return from_keras(model, loss, input_spec)


def _check_layers(model: tf.keras.Model) -> None:
  for layer in _layers(model):
    for kind, instead in _STATEFUL.items():
      if isinstance(layer, kind):
        raise ValueError(
          f'layer {layer.name!r} ({type(layer).__name__}) updates its state'
          f' in training, which a pure function of the weights cannot; use'
          f' {instead}.'
        )
    if isinstance(layer, _RANDOM):
      raise ValueError(
        f'layer {layer.name!r} ({type(layer).__name__}) draws from a'
        ' stateful random generator, which no runtime can replay per'
        ' client; remove it (or regularize otherwise).'
      )


def _layers(model: tf.keras.Model) -> Sequence[tf.keras.layers.Layer]:
  return [m for m in (model, *model.submodules) if isinstance(m, tf.keras.layers.Layer)]


def _owners(model: tf.keras.Model) -> dict[Any, list[tuple[Any, str]]]:
  """variable ref -> the (layer, attribute) pairs holding it (a shared layer's variable
  is held once per layer object)."""
  owners: dict[Any, list[tuple[Any, str]]] = {}
  for layer in _layers(model):
    for name, value in vars(layer).items():
      if isinstance(value, tf.Variable):
        owners.setdefault(value.ref(), []).append((layer, name))
  return owners


def _eager_tensors(model: tf.keras.Model) -> list[tuple[Any, str, np.ndarray]]:
  """(layer, attribute, value) of the eager tensors layers keep beside their variables
  (an adapted Normalization's broadcast mean and variance), which a graph (TFF's
  computations) cannot capture: each call makes them constants of its own graph."""
  return [
    (layer, name, value.numpy())
    for layer in _layers(model)
    for name, value in vars(layer).items()
    if isinstance(value, tf.Tensor)
    and not isinstance(value, tf.Variable)
    and hasattr(value, 'numpy')
  ]


@contextlib.contextmanager
def _substituted(
  owners,
  variables: Sequence[tf.Variable],
  values: Sequence[tf.Tensor],
  constants: Sequence[tuple[Any, str, np.ndarray]],
):
  """Points every attribute holding one of `variables` at its value, and every kept
  eager tensor at a constant of the current graph, while the context runs.
  `object.__setattr__` skips Keras's attribute tracking, which would otherwise record
  the tensors as the layer's weights."""
  saved = []
  try:
    for variable, value in zip(variables, values, strict=True):
      for layer, name in owners[variable.ref()]:
        saved.append((layer, name, variable))
        object.__setattr__(layer, name, value)
    for layer, name, value in constants:
      saved.append((layer, name, getattr(layer, name)))
      object.__setattr__(layer, name, tf.constant(value))
    yield
  finally:
    for layer, name, original in reversed(saved):
      object.__setattr__(layer, name, original)


def _vectorizable_convolution(
  layer: tf.keras.layers.Conv1D | tf.keras.layers.Conv2D,
) -> Callable[[tf.Tensor, tf.Tensor], tf.Tensor]:
  """`layer.convolution_op` as `vectorizable.conv1d` or `conv2d`."""
  # Keras pads a causal Conv1D's input in `call`, then convolves VALID.
  padding = 'VALID' if layer.padding == 'causal' else layer.padding.upper()
  if layer.rank == 1:
    return lambda x, kernel: vectorizable.conv1d(
      x, kernel, layer.strides[0], padding, layer.dilation_rate[0]
    )
  return lambda x, kernel: vectorizable.conv2d(
    x, kernel, layer.strides, padding, layer.dilation_rate
  )


@contextlib.contextmanager
def _lanes_convolutions(layers: Sequence[tf.keras.layers.Conv1D | tf.keras.layers.Conv2D]):
  """The Conv1D and Conv2D `layers` convolve with `vectorizable`'s ops, which
  `tf.vectorized_map` vectorizes for each lane's own kernel (an instance attribute
  shadows the layer's `convolution_op`), while the context runs."""
  try:
    for layer in layers:
      object.__setattr__(layer, 'convolution_op', _vectorizable_convolution(layer))
    yield
  finally:
    for layer in layers:
      vars(layer).pop('convolution_op', None)


def _batch_seed(x: Any) -> tf.Tensor:
  """A stateless seed that is a function of the batch alone (its values and their
  order), so every runtime draws the same masks for the same batch, whatever the last
  bits of its weights."""

  def digest(tensor, odd):
    bits = tf.cast(tf.bitcast(tf.cast(tf.reshape(tensor, [-1]), tf.float32), tf.int32), tf.int64)
    # Multipliers by position: a permutation of the examples changes the digest.
    return tf.reduce_sum(bits * (2 * tf.range(tf.size(bits, tf.int64)) + odd))

  parts = tf.nest.flatten(x)
  return tf.stack([digest(parts[0], 1), digest(parts[-1], 3)])


class _SeededGenerator:
  """Stands in for a Dropout layer's random generator during a call: the layer's
  mask drawn by `tf.nn.experimental.stateless_dropout` from `seed`."""

  def __init__(self, seed: tf.Tensor):
    self._seed = seed

  def dropout(self, inputs, rate, noise_shape=None):
    return tf.nn.experimental.stateless_dropout(inputs, rate, self._seed, noise_shape=noise_shape)


@contextlib.contextmanager
def _stateless_dropout(layers: Sequence[tf.keras.layers.Dropout], seed: tf.Tensor | None):
  """The Dropout `layers` draw their masks from `seed` (folded with each layer's
  position), not from Keras's stateful generator, while the context runs."""
  saved = [(layer, layer._random_generator) for layer in layers]
  try:
    for i, layer in enumerate(layers):
      object.__setattr__(
        layer,
        '_random_generator',
        _SeededGenerator(tf.random.experimental.stateless_fold_in(seed, i)),
      )
    yield
  finally:
    for layer, generator in saved:
      object.__setattr__(layer, '_random_generator', generator)


@tf.custom_gradient
def _dense_gradient(weight: tf.Tensor):
  """The identity, with a dense gradient: an Embedding's lookup would otherwise give
  IndexedSlices, which the client rules' arithmetic on gradients does not take."""
  return tf.identity(weight), tf.convert_to_tensor


def check_model_name(name: str, built_in: Sequence[str]) -> None:
  """Raises ValueError (one line) unless `name` is one of the task's own models
  (`built_in`), a registered one (named in the message), or `file.py:function` or
  `module:function` naming a builder that loads (`model_builder`); a task checks before
  it builds its data."""
  from tff_comp import registry

  if ':' in name:
    model_builder(name)
    return
  registered = registry.MODELS.names()
  if name in built_in or name in registered:
    return
  # The registry's own message lists only the registered models; a task's own are not.
  close = difflib.get_close_matches(name, [*built_in, *registered], n=1)
  raise ValueError(
    f'unknown model {name!r}.'
    + (f' Did you mean {close[0]!r}?' if close else '')
    + f" This task's own: {', '.join(built_in) or 'none'}; registered:"
    f' {", ".join(registered) or "none"} (registry.register_model adds one; or'
    ' give path/to/file.py:function or module:function).'
  )


def model_builder(name: str) -> Callable[..., tf.keras.Model]:
  """The model builder `name` names: `path/to/file.py:function` (the file loaded as a
  module of its own) or `module:function` (imported), a function `(input_shape,
  num_classes, seed) -> tf.keras.Model` as `registry.register_model` takes; else the
  registered model `name`. A model without a package, from the command line.

  Raises:
    ValueError: (one line) the file or module does not load, or has no such function.
  """
  from tff_comp import registry

  if ':' not in name:
    return registry.MODELS.get(name).builder
  where, _, function = name.rpartition(':')
  try:
    module = _load(where)
  except Exception as e:  # a user's file: whatever it raises, said in one line
    raise ValueError(f'model {name!r}: {where} does not load ({type(e).__name__}: {e}).') from e
  builder = getattr(module, function, None)
  if not callable(builder):
    raise ValueError(f'model {name!r}: {where} has no function {function!r}.')
  return builder


@functools.cache
def _load(where: str) -> types.ModuleType:
  """The module `where` names: a .py file (loaded once, under a name of its own) or an
  importable module."""
  if not where.endswith('.py'):
    return importlib.import_module(where)
  path = pathlib.Path(where).resolve()
  if not path.is_file():
    raise FileNotFoundError(f'no file {path}')
  spec = importlib.util.spec_from_file_location(f'tff_comp_model_{path.stem}', path)
  if spec is None or spec.loader is None:
    raise ImportError(f'{path} cannot be imported as a Python module')
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def registered_classifier(
  name: str,
  input_shape: tuple[int, ...],
  num_classes: int,
  seed: int,
  built_in: Sequence[str] = (),
) -> tff.learning.models.FunctionalModel:
  """The model `name` (a plugin's, `registry.register_model`, or `file.py:function`,
  `model_builder`) built for images of `input_shape` and `num_classes` labels (its
  initial weights from `seed`), trained on the cross-entropy of its logits. `built_in`:
  the task's own models, named with the registered ones when `name` is neither.

  Raises:
    ValueError: `name` names no model (or one that does not load), or its builder's
      model is not one `from_keras` converts.
  """
  check_model_name(name, built_in)
  builder = model_builder(name)
  tf.keras.utils.set_random_seed(seed)
  return from_keras(
    builder(input_shape, num_classes, seed),
    tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    (tf.TensorSpec([None, *input_shape], tf.float32), tf.TensorSpec([None], tf.int32)),
  )
