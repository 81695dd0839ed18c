"""`bench.py`'s workloads beyond lasso: part 6, FedAvg on an EMNIST-shaped CNN against
TFF's Keras FedAvg and a plain Keras loop; part 7, streaming a StackOverflow-sized
population."""

import time

import numpy as np
import psutil  # installed with TFF (portpicker requires it)
import tensorflow as tf
import tensorflow_federated as tff

from tff_comp import data as data_lib
from tff_comp import keras_models
from tff_comp.algorithms import fedavg
from tff_comp.binaries import bench_peers
from tff_comp.binaries import bench_timing as timing
from tff_comp.run import sampling
from tff_comp.runtime import choice, inprocess
from tff_comp.tasks import emnist, generated


def _keras_floor(arrays: data_lib.ClientArrays, batch: int, lr: float):
  """run_round(picks): one Keras model trained client by client over the same batches
  (a tf.function SGD step), then the example-weighted mean of the clients' models."""
  model, loss = emnist.cnn(62), tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
  variables = model.trainable_variables
  weights = [[v.numpy() for v in variables]]
  offsets = np.concatenate([[0], np.cumsum(arrays.counts)])
  x_all, y_all = arrays.examples

  @tf.function
  def step(x, y):
    with tf.GradientTape() as tape:
      value = loss(y, model(x, training=True))
    for variable, gradient in zip(variables, tape.gradient(value, variables)):
      variable.assign_sub(lr * gradient)

  def run_round(picks_r):
    total, summed = 0, [np.zeros_like(w) for w in weights[0]]
    for i in picks_r:
      for variable, w in zip(variables, weights[0]):
        variable.assign(w)
      x, y = x_all[offsets[i] : offsets[i + 1]], y_all[offsets[i] : offsets[i + 1]]
      for start in range(0, len(y), batch):
        step(x[start : start + batch], y[start : start + batch])
      total += len(y)
      summed = [s + len(y) * v.numpy() for s, v in zip(summed, variables)]
    weights[0] = [s / total for s in summed]

  return run_round


def cnn_clients(population: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
  """Part 6's clients: random 28x28x1 images in [0, 1) and labels of 62 classes, about
  224 examples a client (as EMNIST's writers). The peers draw the same
  (`binaries/peers/protocol.py`, NumPy only; a test compares the two)."""
  rng = np.random.default_rng(0)
  clients = {}
  for i in range(population):
    n = int(rng.integers(180, 269))
    clients[f'w{i}'] = (
      rng.random((n, 28, 28, 1), np.float32),
      rng.integers(0, 62, n).astype(np.int32),
    )
  return clients


def part6(rounds: int, repeats: int, per_round: int) -> None:
  batch, lr, population = 20, 0.02, 2 * per_round
  clients = cnn_clients(population)
  data = tff.simulation.datasets.TestClientData(clients)
  ids = list(data.client_ids)
  picks = timing.selections(population, per_round, 1 + rounds * repeats + 10)
  spec = (tf.TensorSpec([None, 28, 28, 1], tf.float32), tf.TensorSpec([None], tf.int32))
  loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
  ours = fedavg.build_fedavg(
    keras_models.from_keras(emnist.cnn(62), loss, spec), client_learning_rate=lr, batch_size=batch
  )
  fast, _ = choice.runner_for(ours, data, 'inprocess')
  builtin = tff.learning.algorithms.build_weighted_fed_avg(
    lambda: tff.learning.models.from_keras_model(emnist.cnn(62), loss, input_spec=spec),
    tff.learning.optimizers.build_sgdm(lr),
    tff.learning.optimizers.build_sgdm(1.0),
  )
  builtin_state = [builtin.initialize()]

  def builtin_round(r):
    datasets = [data.create_tf_dataset_for_client(ids[i]).batch(batch) for i in picks[r]]
    builtin_state[0] = builtin.next(builtin_state[0], datasets).state

  floor = _keras_floor(data_lib.client_arrays(data), batch, lr)
  with bench_peers.Peers(
    rounds, workload='cnn', clients=per_round, batch_size=batch, learning_rate=lr
  ) as peers:
    a, peers_a = timing.time_rounds_between(
      timing.round_runner(fast, ids, picks), rounds, repeats, peers.block, warmup=1
    )
  # Lanes (convolutions as per-tap matmuls under XLA) are slow on a CPU: a few rounds suffice.
  lanes = inprocess.build(ours, data, engine='lanes')
  lanes.reserve_cohort(per_round)
  start = time.perf_counter()
  run_lanes = timing.round_runner(lanes, ids, picks)
  run_lanes(0)
  first = time.perf_counter() - start
  b = timing.time_rounds(run_lanes, min(rounds, 3), 1, warmup=0)
  c = timing.time_rounds(builtin_round, rounds, repeats, warmup=1)
  d = timing.time_rounds(lambda r: floor(picks[r]), rounds, repeats, warmup=1)
  examples = np.mean([sum(len(clients[ids[i]][1]) for i in p) for p in picks])
  print(
    f'Part 6: FedAvg round, EMNIST CNN ({per_round} clients x ~224 examples, batch'
    f' {batch}, 1 epoch, synthetic data); median of {repeats} x {rounds} rounds'
  )
  for label, value in (
    (f'(a) tff_comp fedavg, in-process {fast.record["engine"]}', a),
    ('(b) tff_comp fedavg, in-process lanes', b),
    ('(c) TFF build_weighted_fed_avg (Keras)', c),
    ('(d) plain Keras loop, one model (the floor)', d),
  ):
    print(f'  {label:48s} {value:.3f} s/round  {examples / value:7.0f} examples/s')
  print(
    f'  a/d = {a / d:.3f} (target <= 1)   a/c = {a / c:.3f} (target < 1)   b/a ='
    f" {b / a:.2f}; lanes' first round (compiling) {first:.1f} s"
  )
  for label, seconds in peers_a.items():  # the same data drawn (`peers/protocol.py`)
    print(
      f"  {label} fedavg (same run), blocks between (a)'s: median {seconds:.3f} s/round"
      f'  {examples / seconds:7.0f} examples/s; a / {label} = {a / seconds:.3f} (target <= 1)'
    )


def _sentences(clients: int, seed: int = 0) -> tff.simulation.datasets.ClientData:
  """StackOverflow-shaped clients: sentences of 20 token ids (vocabulary 1,000), the
  next token as the label."""

  def make(n, key):
    tokens = tf.random.stateless_uniform([n, 21], key, 0, 1000, tf.int32)
    return tf.cast(tokens[:, :20], tf.float32), tokens[:, 20]

  return generated.client_data('so', generated.lognormal_sizes(clients, 397, seed, 1.0), seed, make)


def _bag_of_words() -> tff.learning.models.FunctionalModel:
  tf.keras.utils.set_random_seed(0)
  model = tf.keras.Sequential(
    [
      tf.keras.layers.InputLayer((20,)),
      tf.keras.layers.Embedding(1000, 16),
      tf.keras.layers.GlobalAveragePooling1D(),
      tf.keras.layers.Dense(1000),
    ]
  )
  return keras_models.from_keras(
    model,
    tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    (tf.TensorSpec([None, 20], tf.float32), tf.TensorSpec([None], tf.int32)),
  )


def part7(rounds: int, repeats: int) -> None:
  per_round, process = 50, psutil.Process()
  algorithm = fedavg.build_fedavg(_bag_of_words(), client_learning_rate=0.1, batch_size=16)
  population = _sentences(342_477)
  start = time.perf_counter()
  streamed = inprocess.build(algorithm, population, data_memory_budget=512)
  built = time.perf_counter() - start
  ids = list(population.client_ids)
  sampler = sampling.ClientSampler(ids, per_round, 0)
  state, rss = streamed.initialize(), []
  start = time.perf_counter()
  for r in range(1, rounds + 1):
    if r < rounds:
      streamed.prefetch(sampler.sample(r + 1).reporting)
    state = streamed.next(state, list(sampler.sample(r).reporting)).state
    rss.append(process.memory_info().rss / 2**20)
  seconds = (time.perf_counter() - start) / rounds
  print(
    f'Part 7: streaming, StackOverflow-shaped population ({len(ids):,} clients, 20'
    f' tokens a sentence), FedAvg, {per_round} clients per round, {rounds} rounds,'
    f' local data shuffled: {streamed.algorithm.client_options.shuffle} (the default)'
  )
  print(f'  built in {built:.1f} s ({streamed.description})')
  growth = (
    f'; growth from round 50 {100 * (rss[-1] / rss[49] - 1):+.1f}% (target < 2%)'
    if rounds > 50
    else ''
  )
  print(
    f'  {seconds:.3f} s/round; host RSS {rss[0]:,.0f} MB after round 1, max'
    f' {max(rss):,.0f} MB, last {rss[-1]:,.0f} MB (target < 2,048){growth}'
  )
  small = _sentences(2_000)
  small_ids = list(small.client_ids)
  picks = timing.selections(len(small_ids), per_round, 1 + rounds * repeats + 10)
  timings = {}
  for label, budget in (('resident', None), ('streaming', 0.0)):
    runtime = inprocess.build(algorithm, small, engine='mapped', data_memory_budget=budget)
    timings[label] = timing.time_rounds(
      timing.round_runner(runtime, small_ids, picks), rounds, repeats, warmup=1
    )
  print(
    f'  2,000 clients: resident {timings["resident"]:.3f} s/round, streaming'
    f' {timings["streaming"]:.3f} s/round, ratio'
    f' {timings["streaming"] / timings["resident"]:.2f} (target <= 1.2)'
  )
