r"""Seconds per FedAvg round on the lasso shape, against references measured in this run.

    python binaries/bench.py [--rounds=30] [--repeats=3]

(a) tff_comp's `fedavg`: client ids in, data read where the computation runs, local
    steps in-graph;
(b) TFF's `build_weighted_fed_avg`, fed datasets built in Python every round, as TFF's
    tutorials do;
(c) a plain `tf.function` doing the same local SGD work in one process: same model and
    autodiff, data already in memory as tensors, batches sliced in-graph (the floor: no
    federated runtime, no data loading).
Lasso dataset I: 10 clients per round x 128 examples, d = 1024, batch 10, one epoch.
Prints the median of --repeats timings of --rounds rounds each, and the ratios a/b, a/c.
"""

import os

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')

# pylint: disable=g-import-not-at-top,wrong-import-position
import statistics
import time

from absl import app
from absl import flags
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

import tff_comp  # pylint: disable=unused-import  (installs the runtime)
from tasks import lasso
from tff_comp.algorithms import fedavg

_ROUNDS = flags.DEFINE_integer('rounds', 30, 'Timed rounds per repeat.')
_REPEATS = flags.DEFINE_integer('repeats', 3, 'Repeats; the median is reported.')
CLIENTS, BATCH, LR = 10, 10, 1e-3


def _time(run_round, rounds: int, repeats: int) -> float:
  for r in range(3):  # warm-up: tracing and the worker's function caches
    run_round(r)
  timings = []
  for _ in range(repeats):
    start = time.perf_counter()
    for r in range(rounds):
      run_round(r)
    timings.append((time.perf_counter() - start) / rounds)
  return statistics.median(timings)


def _selections(num_clients: int, total: int):
  rng = np.random.default_rng(0)
  return [rng.choice(num_clients, CLIENTS, replace=False) for _ in range(total)]


def main(argv):
  del argv
  task = lasso.build_lasso_task(dataset='I')
  ids = task.train_data.client_ids
  picks = _selections(len(ids), 3 + _ROUNDS.value * _REPEATS.value + 10)

  ours = tff.simulation.compose_dataset_computation_with_learning_process(
      task.train_data.dataset_computation,
      fedavg.build_fedavg(task.model, client_learning_rate=LR, batch_size=BATCH))
  state = [ours.initialize()]

  def ours_round(r):
    state[0] = ours.next(state[0], [ids[i] for i in picks[r]]).state

  builtin = tff.learning.algorithms.build_weighted_fed_avg(
      task.model, tff.learning.optimizers.build_sgdm(LR),
      tff.learning.optimizers.build_sgdm(1.0))
  builtin_state = [builtin.initialize()]

  def builtin_round(r):
    datasets = [task.train_data.create_tf_dataset_for_client(ids[i]).batch(BATCH)
                for i in picks[r]]
    builtin_state[0] = builtin.next(builtin_state[0], datasets).state

  _, clients = lasso._generate('I', 0, 1.0, 1.0)  # pylint: disable=protected-access
  all_x = tf.constant(np.stack([c[0] for c in clients]))
  all_y = tf.constant(np.stack([c[1] for c in clients]))
  model = task.model
  weights = [tuple(tf.constant(w) for w in model.initial_weights[0])]

  @tf.function
  def plain_round(global_weights, chosen):
    def client(i):
      x, y = tf.gather(all_x, i), tf.gather(all_y, i)
      steps = (tf.shape(y)[0] + BATCH - 1) // BATCH

      def body(k, w):
        xb, yb = x[k * BATCH:(k + 1) * BATCH], y[k * BATCH:(k + 1) * BATCH]
        with tf.GradientTape() as tape:
          tape.watch(w)
          loss = model.loss(model.predict_on_batch((w, ()), xb), yb)
        return k + 1, tuple(a - LR * g for a, g in zip(w, tape.gradient(loss, w)))
      return tf.while_loop(lambda k, _: k < steps, body, (0, global_weights))[1]
    updates = tf.map_fn(client, chosen, fn_output_signature=(tf.float32, tf.float32))
    return tuple(tf.reduce_mean(u, 0) for u in updates)

  def plain(r):
    weights[0] = plain_round(weights[0], tf.constant(picks[r], tf.int32))

  rounds, repeats = _ROUNDS.value, _REPEATS.value
  a = _time(ours_round, rounds, repeats)
  b = _time(builtin_round, rounds, repeats)
  c = _time(plain, rounds, repeats)
  print(f'FedAvg round, lasso I ({CLIENTS} clients x 128 examples, d={lasso.DIM}, '
        f'batch {BATCH}, 1 epoch); median of {repeats} x {rounds} rounds')
  print(f'  (a) tff_comp fedavg                          {a:.4f} s/round')
  print(f'  (b) TFF build_weighted_fed_avg, Python data  {b:.4f} s/round')
  print(f'  (c) plain tf.function, data in memory        {c:.4f} s/round')
  print(f'  a/b = {a / b:.3f}   (target <= 0.5)')
  print(f'  a/c = {a / c:.3f}   (target <= 6)')


if __name__ == '__main__':
  app.run(main)
