"""Keras models on the in-process runtime (`keras_models.from_keras`): parity with TFF's
own Keras path (`tff.learning.models.from_keras_model` in TFF's FedAvg, and
`functional_model_from_keras` under our FedDualAvg on TFF's runtime)."""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_comp import keras_models, registry
from tff_comp.ops import regularizers, vectorizable
from tff_comp.runtime import choice, inprocess
from tff_comp.runtime.inprocess import engines

BATCH, ROUNDS, CLASSES = 4, 3, 5
IDS = ['a', 'b', 'c', 'd']
_L = tf.keras.layers


def _cnn(seed=0):
  tf.keras.utils.set_random_seed(seed)
  return tf.keras.Sequential(
    [
      tf.keras.layers.InputLayer((8, 8, 1)),
      tf.keras.layers.Conv2D(4, 3, activation='relu'),
      tf.keras.layers.Conv2D(6, 3, activation='relu'),
      tf.keras.layers.MaxPool2D(),
      tf.keras.layers.Flatten(),
      tf.keras.layers.Dense(8, activation='relu'),
      tf.keras.layers.Dense(CLASSES),
    ]
  )


def _lstm(seed=0):
  tf.keras.utils.set_random_seed(seed)
  return tf.keras.Sequential(
    [
      tf.keras.layers.InputLayer((6,)),
      tf.keras.layers.Embedding(10, 4),
      tf.keras.layers.LSTM(5),
      tf.keras.layers.LayerNormalization(),
      tf.keras.layers.Dense(CLASSES),
    ]
  )


def _data(kind):
  rng = np.random.default_rng(1)
  clients = {}
  for i, cid in enumerate(IDS):
    n = 6 + 3 * i
    x = (
      rng.normal(size=(n, 8, 8, 1)) if kind == 'cnn' else rng.integers(0, 10, size=(n, 6))
    ).astype(np.float32)
    clients[cid] = (x, rng.integers(0, CLASSES, size=n).astype(np.int32))
  return tff.simulation.datasets.TestClientData(clients)


MAKERS = {'cnn': (_cnn, (8, 8, 1)), 'lstm': (_lstm, (6,))}
LOSS = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def _spec(kind):
  return (tf.TensorSpec([None, *MAKERS[kind][1]], tf.float32), tf.TensorSpec([None], tf.int32))


def _ours(kind, algorithm, engine='auto', shuffle=True, **extra):
  model = keras_models.from_keras(MAKERS[kind][0](), LOSS, _spec(kind))
  built = (
    registry.get_algorithm(algorithm)
    .build(model, **{'client_learning_rate': 0.1, 'batch_size': BATCH, **extra})
    .with_client_options(shuffle=shuffle)
  )
  runtime, _ = choice.runner_for(built, _data(kind), 'inprocess', engine=engine)
  state = runtime.initialize()
  for r in range(ROUNDS):
    state = runtime.next(state, IDS[r : r + 2]).state
  return runtime, runtime.get_model_weights(state).trainable


@pytest.mark.parametrize(
  'kind, engine',
  # auto runs a CNN mapped on a CPU; lanes' per-tap convolutions: each layer below, and
  # end to end under make test-slow.
  [
    ('cnn', 'auto'),
    pytest.param('cnn', 'lanes', marks=pytest.mark.slow),
    pytest.param('lstm', 'auto', marks=pytest.mark.slow),  # an RNN's lanes trace: gru below
  ],
)
def test_fedavg_with_a_keras_model_in_process_is_tffs_keras_fedavg(kind, engine):
  """Lanes run a CNN's convolutions as per-tap matmuls (`ops.vectorizable`)."""
  make, _ = MAKERS[kind]
  runtime, got = _ours(kind, 'fedavg', engine, shuffle=False)  # as TFF's FedAvg reads data
  assert runtime.name == 'inprocess' and runtime.engine == {'auto': 'mapped'}.get(engine, engine)
  process = tff.learning.algorithms.build_weighted_fed_avg(
    lambda: tff.learning.models.from_keras_model(make(), LOSS, input_spec=_spec(kind)),
    tff.learning.optimizers.build_sgdm(0.1),
    tff.learning.optimizers.build_sgdm(1.0),
  )
  data, state = _data(kind), process.initialize()
  for r in range(ROUNDS):
    state = process.next(
      state, [data.create_tf_dataset_for_client(c).batch(BATCH) for c in IDS[r : r + 2]]
    ).state
  want = process.get_model_weights(state).trainable
  assert max(np.abs(a - b).max() for a, b in zip(got, make().get_weights())) > 1e-3
  for a, b in zip(got, want):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


# FedAvg's test runs the CNN on lanes by default; FedDualAvg's, in the slow suite.
@pytest.mark.parametrize(
  'kind, engine',
  [
    ('cnn', 'auto'),
    pytest.param('cnn', 'lanes', marks=pytest.mark.slow),
    pytest.param('lstm', 'auto', marks=pytest.mark.slow),  # FedAvg's LSTM above
  ],
)
def test_feddualavg_with_a_keras_model_matches_tffs_conversion_on_tffs_runtime(kind, engine):
  make, _ = MAKERS[kind]
  extra = dict(regularizer=regularizers.L1(strength=0.01))
  _, got = _ours(kind, 'feddualavg', engine, **extra)
  theirs = registry.get_algorithm('feddualavg').build(
    tff.learning.models.functional_model_from_keras(make(), LOSS, _spec(kind)),
    client_learning_rate=0.1,
    batch_size=BATCH,
    **extra,
  )
  runtime, _ = choice.runner_for(theirs, _data(kind), 'tff')
  state = runtime.initialize()
  for r in range(ROUNDS):
    state = runtime.next(state, IDS[r : r + 2]).state
  for a, b in zip(got, runtime.get_model_weights(state).trainable):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('kind, op', [('cnn', 'Conv2D'), ('lstm', 'TensorListReserve')])
def test_auto_runs_convolutions_and_rnns_mapped_saying_why(kind, op):
  runtime, _ = _ours(kind, 'fedavg')
  assert runtime.record['engine'] == 'mapped' and op in runtime.record['why']


def test_auto_traces_a_step_only_as_often_as_its_choice_needs(monkeypatch):
  """'auto' maps a run too short to repay compiling without tracing the step; a long
  run's step is traced once, and again across lanes only where that traces it otherwise
  (a convolution: per-tap matmuls); the reasons are those of the ops found."""
  traced = []
  step_nodes = engines._step_nodes

  def counted(*args, across_lanes=False):
    traced.append(across_lanes)
    return step_nodes(*args, across_lanes=across_lanes)

  monkeypatch.setattr(engines, '_step_nodes', counted)
  for kind, rounds, want, why in [
    ('lstm', 1, [], 'too short to repay compiling'),
    ('lstm', 10**6, [False], 'TensorListReserve'),
    ('cnn', 10**6, [False, True], 'Conv2D'),
  ]:
    traced.clear()
    built = registry.get_algorithm('fedavg').build(
      keras_models.from_keras(MAKERS[kind][0](), LOSS, _spec(kind)),
      client_learning_rate=0.1,
      batch_size=BATCH,
    )
    runtime = inprocess.build(built, _data(kind), client_rounds=rounds)
    assert runtime.engine == 'mapped' and why in runtime.why, (kind, runtime.why)
    assert traced == want, (kind, rounds)


def test_auto_runs_a_depthwise_convolution_mapped_on_a_cpu_saying_why():
  """It vectorizes (test_a_standard_layer_vectorizes...), into a grouped convolution
  XLA runs slowly on a CPU."""
  tf.keras.utils.set_random_seed(0)
  model = tf.keras.Sequential(
    [_L.InputLayer((8, 8, 1)), _L.DepthwiseConv2D(3), _L.Flatten(), _L.Dense(CLASSES)]
  )
  built = registry.get_algorithm('fedavg').build(
    keras_models.from_keras(model, LOSS, _spec('cnn')), client_learning_rate=0.1, batch_size=BATCH
  )
  runtime, _ = choice.runner_for(built, _data('cnn'), 'inprocess')
  assert runtime.engine == 'mapped' and 'DepthwiseConv2dNative' in runtime.why


def test_a_frozen_layer_keeps_its_weights_and_the_rest_trains():
  model = _cnn()
  model.layers[0].trainable = False
  frozen = [w.copy() for w in model.layers[0].get_weights()]
  converted = keras_models.from_keras(model, LOSS, _spec('cnn'))
  assert len(converted.initial_weights[1]) == 2  # the frozen conv's kernel and bias
  built = registry.get_algorithm('fedavg').build(
    converted, client_learning_rate=0.1, batch_size=BATCH
  )
  runtime, _ = choice.runner_for(built, _data('cnn'), 'inprocess')
  state = runtime.next(runtime.initialize(), IDS).state
  weights = runtime.get_model_weights(state)
  for a, b in zip(weights.non_trainable, frozen):
    np.testing.assert_array_equal(a, b)
  assert np.abs(weights.trainable[0] - converted.initial_weights[0][0]).max() > 0


@pytest.mark.parametrize(
  'layer, says',
  [
    (tf.keras.layers.BatchNormalization(), 'GroupNormalization'),
    (tf.keras.layers.GaussianDropout(0.1), 'random generator'),
  ],
)
def test_layers_a_pure_function_cannot_run_are_refused_by_name(layer, says):
  model = tf.keras.Sequential(
    [tf.keras.layers.InputLayer((4,)), tf.keras.layers.Dense(3), layer, tf.keras.layers.Dense(2)]
  )
  with pytest.raises(ValueError, match=f"layer '{layer.name}'.*{says}"):
    keras_models.from_keras(model, LOSS, (tf.TensorSpec([None, 4]), tf.TensorSpec([None])))


@pytest.mark.slow  # second order through Keras: the standard layers' gradients below
def test_per_fedavg_exact_differentiates_a_keras_cnn_twice_as_tffs_conversion():
  """Second-order MAML through the substituted weights: Per-FedAvg's exact variant
  in-process equals it on TFF's runtime with TFF's own conversion."""
  extra = dict(variant='exact', alpha=0.05, local_steps=2, batch_size=2)
  _, got = _ours('cnn', 'per_fedavg', **extra)
  theirs = registry.get_algorithm('per_fedavg').build(
    tff.learning.models.functional_model_from_keras(_cnn(), LOSS, _spec('cnn')),
    client_learning_rate=0.1,
    **extra,
  )
  runtime, _ = choice.runner_for(theirs, _data('cnn'), 'tff')
  state = runtime.initialize()
  for r in range(ROUNDS):
    state = runtime.next(state, IDS[r : r + 2]).state
  _, first_order = _ours('cnn', 'per_fedavg', **dict(extra, variant='fo'))
  assert max(np.abs(a - b).max() for a, b in zip(got, first_order)) > 1e-6
  for a, b in zip(got, runtime.get_model_weights(state).trainable):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def _dropout_model(rate=0.3):
  tf.keras.utils.set_random_seed(0)
  return tf.keras.Sequential(
    [tf.keras.layers.InputLayer((8,)), tf.keras.layers.Dense(64), tf.keras.layers.Dropout(rate)]
  )


def test_dropout_draws_its_masks_from_the_batch_statelessly():
  """Masks at the layer's rate, scaled by 1/(1 - rate), the same for the same batch
  whatever the weights' last bits, new for another batch, none outside
  training."""
  model = _dropout_model()
  converted = keras_models.from_keras(
    model, LOSS, (tf.TensorSpec([None, 8]), tf.TensorSpec([None], tf.int32))
  )
  weights = tf.nest.map_structure(tf.constant, converted.initial_weights)
  x = tf.constant(np.random.default_rng(0).normal(size=(500, 8)), tf.float32)
  plain = model(x, training=False).numpy()
  first = converted.predict_on_batch(weights, x, training=True).numpy()
  np.testing.assert_array_equal(first, converted.predict_on_batch(weights, x).numpy())
  np.testing.assert_allclose(
    converted.predict_on_batch(weights, x, training=False), plain, rtol=1e-6
  )
  kept = first != 0
  assert abs(1 - kept.mean() - 0.3) < 0.01  # 32,000 draws: 5 sigma is 0.013
  np.testing.assert_allclose(first[kept], plain[kept] / 0.7, rtol=1e-5)
  moved = ((weights[0][0], weights[0][1] + 1e-3), ())
  np.testing.assert_array_equal(converted.predict_on_batch(moved, x).numpy() != 0, kept)
  other = converted.predict_on_batch(weights, x + 1.0).numpy() != 0
  assert 0.3 < (other != kept).mean()  # independent masks differ in 2 p (1 - p) = 42%


def test_dropout_trains_alike_in_process_and_on_tffs_runtime():
  """The masks are a function of each step's batch: FedAvg with a Dropout
  model in-process (mapped) equals it on TFF's runtime (and differs from rate 0)."""
  finals = []
  for rate, name in ((0.5, 'inprocess'), (0.5, 'tff'), (0.0, 'inprocess')):
    model = keras_models.from_keras(
      tf.keras.Sequential(
        [
          tf.keras.layers.InputLayer((8, 8, 1)),
          *_cnn().layers[:-1],
          tf.keras.layers.Dropout(rate),
          tf.keras.layers.Dense(CLASSES),
        ]
      ),
      LOSS,
      _spec('cnn'),
    )
    built = registry.get_algorithm('fedavg').build(
      model, client_learning_rate=0.1, batch_size=BATCH
    )
    runtime, _ = choice.runner_for(built, _data('cnn'), name)
    state = runtime.initialize()
    for r in range(ROUNDS):
      state = runtime.next(state, IDS[r : r + 2]).state
    finals.append(runtime.get_model_weights(state).trainable)
    if rate:
      assert runtime.name == 'tff' or 'Dropout' in runtime.record['why']
  for a, b in zip(finals[0], finals[1]):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
  assert max(np.abs(a - b).max() for a, b in zip(finals[0], finals[2])) > 1e-3


# name: (input shape, whether the inputs are token ids, layers, vectorizes across lanes)
STANDARD_LAYERS = {
  'conv2d_strided_dilated_pooling': (
    (9, 9, 2),
    False,
    lambda: [
      _L.Conv2D(4, 3, strides=2, padding='same'),
      _L.Conv2D(3, 2, dilation_rate=2, activation='relu'),
      _L.MaxPool2D(),
      _L.Flatten(),
      _L.Dense(3),
    ],
    True,
  ),
  'conv1d_causal_pooling': (
    (12, 3),
    False,
    lambda: [
      _L.Conv1D(4, 3, padding='causal', dilation_rate=2),
      _L.MaxPool1D(),
      _L.Conv1D(5, 2, strides=2, padding='same'),
      _L.GlobalAveragePooling1D(),
      _L.Dense(3),
    ],
    True,
  ),
  'group_normalization': (
    (8, 8, 2),
    False,
    lambda: [
      _L.Conv2D(4, 3, padding='same'),
      _L.GroupNormalization(2),
      _L.ReLU(),
      _L.AveragePooling2D(),
      _L.GlobalMaxPool2D(),
      _L.Dense(3),
    ],
    True,
  ),
  'embedding_layer_normalization': (
    (6,),
    True,
    lambda: [
      _L.Embedding(10, 4),
      _L.LayerNormalization(),
      _L.GlobalAveragePooling1D(),
      _L.Dense(3),
    ],
    True,
  ),
  'gru': (
    (6,),
    True,
    lambda: [_L.Embedding(10, 4), _L.GRU(5, return_sequences=True), _L.GRU(4), _L.Dense(3)],
    False,
  ),
  'bidirectional_lstm': ((5, 2), False, lambda: [_L.Bidirectional(_L.LSTM(3)), _L.Dense(3)], False),
  'depthwise_conv2d': (
    (8, 8, 2),
    False,
    lambda: [_L.DepthwiseConv2D(3), _L.Flatten(), _L.Dense(3)],
    True,
  ),
  'separable_conv2d': (
    (8, 8, 2),
    False,
    lambda: [_L.SeparableConv2D(3, 3), _L.Flatten(), _L.Dense(3)],
    False,
  ),
  'grouped_conv2d': (
    (8, 8, 4),
    False,
    lambda: [_L.Conv2D(4, 3, groups=2), _L.Flatten(), _L.Dense(3)],
    False,
  ),
}


def _standard(name, seed=0):
  """A model of the `STANDARD_LAYERS` case, its conversion, and a batch."""
  shape, tokens, layers, _ = STANDARD_LAYERS[name]
  tf.keras.utils.set_random_seed(seed)
  model = tf.keras.Sequential([_L.InputLayer(shape), *layers()])
  rng = np.random.default_rng(seed)
  x = (rng.integers(0, 10, size=(5, *shape)) if tokens else rng.normal(size=(5, *shape))).astype(
    np.float32
  )
  y = rng.integers(0, 3, size=5).astype(np.int32)
  spec = (tf.TensorSpec([None, *shape]), tf.TensorSpec([None], tf.int32))
  return model, keras_models.from_keras(model, LOSS, spec), x, y


def _gradient(converted, weights, x, y):
  with tf.GradientTape() as tape:
    tape.watch(weights)
    loss = converted.loss(converted.predict_on_batch(weights, x), y)
  return tape.gradient(loss, weights[0])


@pytest.mark.parametrize('name', sorted(STANDARD_LAYERS))
def test_a_standard_layer_computes_as_keras_itself(name):
  """The converted model's output and gradient at its weights are the Keras model's
  own (its call and tape over its variables)."""
  model, converted, x, y = _standard(name)
  weights = tf.nest.map_structure(tf.constant, converted.initial_weights)
  np.testing.assert_allclose(
    converted.predict_on_batch(weights, x), model(x, training=True), rtol=1e-5, atol=1e-6
  )
  with tf.GradientTape() as tape:
    loss = LOSS(y, model(x, training=True))
  want = tape.gradient(loss, model.trainable_weights)
  for got, expected in zip(_gradient(converted, weights, x, y), want, strict=True):
    np.testing.assert_allclose(got, tf.convert_to_tensor(expected), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
  'name',
  [  # a bidirectional LSTM's ops are an LSTM's twice, group normalization's a
    # convolution's and a layer normalization's (slow suite)
    pytest.param(n, marks=pytest.mark.slow)
    if n in ('bidirectional_lstm', 'group_normalization')
    else n
    for n in sorted(STANDARD_LAYERS)
  ],
)
def test_a_standard_layer_vectorizes_across_lanes_or_the_runtime_knows_up_front(name):
  """Traced for the lanes engine, each lane's gradient with its own weights is its
  gradient alone; where a layer's ops do not vectorize, the trace holds an op the
  in-process runtime maps up front (`_NOT_VECTORIZED`), so no round fails first."""
  _, converted, x, y = _standard(name)
  lanes = [
    tf.nest.map_structure(lambda w, s=s: tf.constant(w * s), converted.initial_weights)
    for s in (1.0, 0.5, -1.5)
  ]
  stacked = tf.nest.map_structure(lambda *w: tf.stack(w), *lanes)
  xs, ys = tf.stack([x, x[::-1], x]), tf.stack([y, y[::-1], y[::-1]])

  @tf.function(autograph=False)
  def across(weights, xs, ys):
    with vectorizable.across_lanes():
      return tf.vectorized_map(
        lambda a: _gradient(converted, *a), (weights, xs, ys), fallback_to_while_loop=False
      )

  if STANDARD_LAYERS[name][-1]:
    got = across(stacked, xs, ys)
    for lane, weights in enumerate(lanes):
      for g, want in zip(got, _gradient(converted, weights, xs[lane], ys[lane]), strict=True):
        np.testing.assert_allclose(g[lane], want, rtol=1e-4, atol=1e-5)
  else:
    with pytest.raises((ValueError, TypeError)):  # pfor's error for the op
      across(stacked, xs, ys)
    with vectorizable.across_lanes():
      graph = (
        tf.function(lambda w: _gradient(converted, w, x, y), autograph=False)
        .get_concrete_function(lanes[0])
        .graph.as_graph_def()
      )
    ops = {n.op for n in graph.node} | {n.op for f in graph.library.function for n in f.node_def}
    assert ops & set(engines._NOT_VECTORIZED)
