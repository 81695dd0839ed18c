r"""Seconds per round, tff_comp's runtimes against references measured in the same run.

    python binaries/bench.py [--rounds=30] [--repeats=3] [--sweep=10,100,1000]
                              [--tff_workers=2] [--memory_rounds=500]

Part 1, FedAvg on the lasso shape (lasso I: 10 clients per round x 128 examples,
d = 1024, batch 10, one epoch):
  (a) tff_comp `fedavg` in-process, lanes engine (`runtime.lanes`, XLA);
  (a') the same, mapped engine (clients by `tf.map_fn`, no XLA: the fallback);
  (b) the same process on TFF's C++ worker (client ids in, data read at the worker);
  (c) TFF's `build_weighted_fed_avg`, datasets built in Python every round, as TFF's
      tutorials do;
  (d) a plain `tf.function` doing the same local SGD work, data in memory, clients by
      `tf.map_fn` (no federated runtime: the floor a hand-written loop reaches).
Part 2, `--sweep`: FedAvg on `synthetic` (`--population` 1,000 clients of heavy-tailed
sizes) at each clients-per-round count, in-process on both engines (and on TFF's
worker up to `--sweep_tff_max`): seconds per round and milliseconds per client.
Part 3, `--tff_workers=N`: part 1's (b) split across N local workers with TFF's
mergeable context (`run.py --workers`) against one worker. On one 2-core machine
no speedup is expected (one worker already uses both cores); across hosts it scales
the clients each worker runs.
Part 4, `--memory_rounds=R`: host memory (RSS of this process) over R rounds of FedAvg
on `synthetic`, all `--population` clients every round (1,000), lanes engine; growth is measured from round
50 (after warm-up) to round R.
Prints the median of --repeats timings of --rounds rounds each, and ratios; the first
(compiling) rounds are warm-up and not timed.
FedJAX is not installed here; its 0.0102 s/round on part 1's shape was measured on these
machines beside (b)-(d) in an earlier run, and is printed for reference only.
"""

import os

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')

# pylint: disable=g-import-not-at-top,wrong-import-position
import statistics
import time

from absl import app
from absl import flags
import numpy as np
import psutil  # installed with TFF (portpicker requires it)
import tensorflow as tf
import tensorflow_federated as tff

from tff_comp.tasks import lasso
from tff_comp.tasks import synthetic
from tff_comp import experiment
from tff_comp import runtime
from tff_comp.algorithms import fedavg
from tff_comp.runtime import inprocess
from tff_comp.runtime import workers

_ROUNDS = flags.DEFINE_integer('rounds', 30, 'Timed rounds per repeat.')
_REPEATS = flags.DEFINE_integer('repeats', 3, 'Repeats; the median is reported.')
_SWEEP = flags.DEFINE_list('sweep', ['10', '100', '1000'],
                           'Clients per round for part 2 (empty: skip part 2).')
_POPULATION = flags.DEFINE_integer('population', 1000, 'Clients of the part 2 task.')
_SWEEP_TFF_MAX = flags.DEFINE_integer(
    'sweep_tff_max', 100, 'Largest clients per round part 2 also times on TFF\'s worker.')
_TFF_WORKERS = flags.DEFINE_integer(
    'tff_workers', 2, 'Part 3: local TFF workers to split rounds across (0: skip).')
_MEMORY_ROUNDS = flags.DEFINE_integer(
    'memory_rounds', 0, 'Part 4: rounds to watch host memory over (0: skip).')
CLIENTS, BATCH, LR = 10, 10, 1e-3
FEDJAX_RECORDED = 0.0102


def _time(run_round, rounds: int, repeats: int) -> float:
  for r in range(3):  # warm-up: tracing and caches
    run_round(r)
  timings = []
  for _ in range(repeats):
    start = time.perf_counter()
    for r in range(rounds):
      run_round(r)
    timings.append((time.perf_counter() - start) / rounds)
  return statistics.median(timings)


def _selections(num_clients: int, per_round: int, total: int):
  rng = np.random.default_rng(0)
  return [rng.choice(num_clients, per_round, replace=False) for _ in range(total)]


def _round_runner(process, ids, picks):
  """run_round(r) for a process taking client ids (either runtime)."""
  state = [process.initialize()]

  def run_round(r):
    state[0] = process.next(state[0], [ids[i] for i in picks[r]]).state
    process.get_model_weights(state[0])  # waits for the round (a GPU runs async)

  return run_round


def _plain_round(model, arrays: inprocess.ClientArrays):
  """The floor: the same local SGD in one tf.function, clients by tf.map_fn."""
  x_all = tf.Variable(arrays.examples[0].reshape(len(arrays.counts), -1, lasso.DIM))
  y_all = tf.Variable(arrays.examples[1].reshape(len(arrays.counts), -1))
  weights = [tuple(tf.constant(w) for w in model.initial_weights[0])]

  @tf.function
  def plain_round(global_weights, chosen):
    def client(i):
      x, y = tf.gather(x_all, i), tf.gather(y_all, i)
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

  def run_round(picks_r):
    weights[0] = plain_round(weights[0], tf.constant(picks_r, tf.int32))
    weights[0][0].numpy()

  return run_round


def part1(rounds: int, repeats: int) -> None:
  task = lasso.build_lasso_task(dataset='I')
  ids = task.train_data.client_ids
  picks = _selections(len(ids), CLIENTS, 3 + rounds * repeats + 10)
  process = fedavg.build_fedavg(task.model, client_learning_rate=LR, batch_size=BATCH)
  fast = inprocess.build(process, task.train_data, engine='lanes')
  mapped = inprocess.build(process, task.train_data, engine='mapped')
  worker, _ = experiment.runner_for(process, task.train_data, 'tff')
  builtin = tff.learning.algorithms.build_weighted_fed_avg(
      task.model, tff.learning.optimizers.build_sgdm(LR),
      tff.learning.optimizers.build_sgdm(1.0))
  builtin_state = [builtin.initialize()]

  def builtin_round(r):
    datasets = [task.train_data.create_tf_dataset_for_client(ids[i]).batch(BATCH)
                for i in picks[r]]
    builtin_state[0] = builtin.next(builtin_state[0], datasets).state

  plain = _plain_round(task.model, task.client_arrays())
  a = _time(_round_runner(fast, ids, picks), rounds, repeats)
  a2 = _time(_round_runner(mapped, ids, picks), rounds, repeats)
  b = _time(_round_runner(worker, ids, picks), rounds, repeats)
  c = _time(builtin_round, rounds, repeats)
  d = _time(lambda r: plain(picks[r]), rounds, repeats)
  print(f'Part 1: FedAvg round, lasso I ({CLIENTS} clients x 128 examples, d={lasso.DIM},'
        f' batch {BATCH}, 1 epoch); median of {repeats} x {rounds} rounds')
  print(f'  (a) tff_comp fedavg, in-process lanes ({fast.device})   {a:.4f} s/round')
  print(f"  (a') tff_comp fedavg, in-process mapped                {a2:.4f} s/round")
  print(f'  (b) tff_comp fedavg, TFF worker                       {b:.4f} s/round')
  print(f'  (c) TFF build_weighted_fed_avg, Python data           {c:.4f} s/round')
  print(f'  (d) plain tf.function (map_fn), data in memory        {d:.4f} s/round')
  print(f"  a/a' = {a / a2:.3f}   a/b = {a / b:.3f}   a/c = {a / c:.3f}   a/d = {a / d:.3f}")
  print(f'  a / FedJAX (recorded {FEDJAX_RECORDED} s/round, not run here) ='
        f' {a / FEDJAX_RECORDED:.3f}   (target <= 0.5)')


def part2(sweep: list[int], population: int, rounds: int, repeats: int,
          tff_max: int) -> None:
  task = synthetic.build_synthetic_task(num_clients=max(population, max(sweep)))
  ids = task.train_data.client_ids
  process = fedavg.build_fedavg(task.model, client_learning_rate=0.01, batch_size=BATCH)
  fast = inprocess.build(process, task.train_data, engine='lanes')
  mapped = inprocess.build(process, task.train_data, engine='mapped')
  worker = None
  sizes = [len(task.train_data.create_tf_dataset_for_client(i)) for i in ids]
  print(f'Part 2: FedAvg on synthetic(1,1), {len(ids)} clients (sizes'
        f' {min(sizes)}-{max(sizes)}), batch {BATCH}, 1 epoch')
  for per_round in sweep:
    picks = _selections(len(ids), per_round, 3 + rounds * repeats + 10)
    a = _time(_round_runner(fast, ids, picks), rounds, repeats)
    a2 = _time(_round_runner(mapped, ids, picks), rounds, repeats)
    line = (f'  {per_round:5d} clients/round: lanes {a:.4f} s/round'
            f' ({1000 * a / per_round:.3f} ms/client); mapped {a2:.4f} s/round'
            f' ({1000 * a2 / per_round:.3f} ms/client)')
    if per_round <= tff_max:
      if worker is None:
        worker, _ = experiment.runner_for(process, task.train_data, 'tff')
      b = _time(_round_runner(worker, ids, picks), rounds, repeats)
      line += (f'; TFF worker {b:.4f} s/round ({1000 * b / per_round:.3f} ms/client);'
               f' ratio {a / b:.3f}')
    print(line, flush=True)


def part3(num_workers: int, rounds: int, repeats: int) -> None:
  task = lasso.build_lasso_task(dataset='I')
  ids = task.train_data.client_ids
  picks = _selections(len(ids), CLIENTS, 3 + rounds * repeats + 10)
  process = fedavg.build_fedavg(task.model, client_learning_rate=LR, batch_size=BATCH)
  one, _ = experiment.runner_for(process, task.train_data, 'tff')
  b = _time(_round_runner(one, ids, picks), rounds, repeats)
  addresses, processes = workers.start_local_workers(num_workers)
  try:
    split, _ = experiment.runner_for(process, task.train_data, 'tff', addresses)
    e = _time(_round_runner(split, ids, picks), rounds, repeats)
  finally:
    for worker in processes:
      worker.kill()
    runtime.install_local_runtime()
  print(f'Part 3: part 1\'s (b) on {num_workers} local TFF workers (mergeable context)'
        f' {e:.4f} s/round vs one worker {b:.4f}: speedup {b / e:.2f}x')


def part4(rounds: int, per_round: int) -> None:
  task = synthetic.build_synthetic_task(num_clients=per_round)
  ids = task.train_data.client_ids
  process = fedavg.build_fedavg(task.model, client_learning_rate=0.01, batch_size=BATCH)
  run_round = _round_runner(inprocess.build(process, task.train_data, engine='lanes'), ids,
                            _selections(len(ids), per_round, rounds))
  me, rss, start = psutil.Process(), {}, time.perf_counter()
  for r in range(rounds):
    run_round(r)
    if r + 1 in (1, 50) or (r + 1) % 100 == 0 or r + 1 == rounds:
      rss[r + 1] = me.memory_info().rss / 2**20
  seconds = time.perf_counter() - start
  base = rss[min(50, rounds)]
  print(f'Part 4: host memory over {rounds} rounds of {per_round} clients (synthetic, lanes),'
        f' {seconds:.0f} s: ' + ', '.join(f'round {r} {m:.0f} MB' for r, m in rss.items())
        + f'; growth from round {min(50, rounds)}: {100 * (rss[rounds] / base - 1):+.1f}%'
        ' (target < 5%)')


def main(argv):
  del argv
  runtime.install_local_runtime()
  part1(_ROUNDS.value, _REPEATS.value)
  if _SWEEP.value:
    part2([int(v) for v in _SWEEP.value], _POPULATION.value, max(3, _ROUNDS.value // 5),
          _REPEATS.value, _SWEEP_TFF_MAX.value)
  if _TFF_WORKERS.value:
    part3(_TFF_WORKERS.value, _ROUNDS.value, _REPEATS.value)
  if _MEMORY_ROUNDS.value:
    part4(_MEMORY_ROUNDS.value, _POPULATION.value)


if __name__ == '__main__':
  app.run(main)
