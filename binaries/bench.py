r"""Seconds per round, tff_comp's runtimes against references measured in the same run.

    python binaries/bench.py [--rounds=30] [--repeats=3] [--sweep=10,100,1000]
                              [--tff_workers=2] [--memory_rounds=500]

Part 1, FedAvg on the lasso shape (lasso I: 10 clients per round x 128 examples,
d = 1024, batch 10, one epoch):
  (a) tff_comp `fedavg` in-process, lanes engine (`runtime.inprocess.lanes`, XLA);
  (a') the same, mapped engine (clients by `tf.map_fn`, no XLA: the fallback);
  (b) the same process on TFF's C++ worker (client ids in, data read at the worker);
  (c) TFF's `build_weighted_fed_avg`, datasets built in Python every round, as TFF's
      tutorials do;
  (d) a plain `tf.function` doing the same local SGD work, data in memory, clients by
      `tf.map_fn` (no federated runtime: the floor a hand-written loop reaches);
  (e) `run.py` end to end, as a user runs it (lanes engine, evaluation off, metrics,
      TensorBoard and checkpoints as by default): wall time per round from its
      metrics.csv `seconds`, rounds 2 to `--run_py_rounds`;
  FedJAX's FedAvg on the same shape (`binaries/peers/fedjax_fedavg.py`, in its own
      virtual environment, `--fedjax_python`; `make bench-peers` builds it), kept
      running beside the bench: its blocks of `--rounds` rounds alternate with (a)'s
      (one before each, one after the last), and one block runs just before (e) and one
      just after, so each ratio compares rounds timed in the same minutes (this
      machine's speed drifts by 10-20% over minutes).
Part 2, `--sweep`: FedAvg on `synthetic` (`--population` 1,000 clients of heavy-tailed
sizes) at each clients-per-round count, in-process on both engines (and on TFF's
worker up to `--sweep_tff_max`): seconds per round and milliseconds per client.
Part 3, `--tff_workers=N`: part 1's (b) split across N local workers with TFF's
mergeable context (`run.py --workers`) against one worker. On one 2-core machine
no speedup is expected (one worker already uses both cores); across hosts it scales
the clients each worker runs.
Part 3, Ray lines, `--ray_actors=N` (`bench_ray.part3_ray`): part 1's lasso shape and
the EMNIST CNN with each round's clients on N actors of a local Ray cluster against one
process (no speedup is expected on one 2-core machine: it shows what Ray costs), with
the bytes a round sends and receives and the driver's round end.
Part 4, `--memory_rounds=R`: host memory (RSS of this process) over R rounds of FedAvg
on `synthetic`, all `--population` clients every round (1,000), lanes engine; growth is
measured from round 50 (after warm-up) to round R.
Part 5, `--first_rounds`: what a user waits for before training: from building the
runtime to the end of round 1 of `make run`'s job (feddualavg on lasso), each engine in
two fresh processes one after the other (the second is "warm": the same configuration
ran before; TF 2.14's XLA persistent cache fails on a CPU, so nothing compiled is
reused, only the OS's file cache); the time `run.py` takes to report a bad flag; and
XLA's compile count of the lanes kernel over 20 rounds with 30% client dropout (cohorts
of changing size), from XLA's own log.
`--workload=emnist_cnn` runs part 6 instead: FedAvg with the EMNIST CNN (Conv 32 3x3,
Conv 64 3x3, max pooling, Dense 128, Dense 62, a Keras model) on synthetic EMNIST-shaped
data (28x28, 62 classes; `--emnist_clients` clients per round of about 224 examples,
batch 20, one epoch, the same clients and initial weights for every system):
  (a) tff_comp fedavg in-process (`tasks.emnist.cnn` through `keras_models.from_keras`;
      auto picks the mapped engine: lanes cannot vectorize a per-client filter);
  (c) TFF's `build_weighted_fed_avg` with `from_keras_model`, datasets built in Python;
  (d) the floor: one Keras model trained client by client over the same batches by a
      `tf.function` SGD step, then the example-weighted mean.
A GPU, where lanes would fill the device with many small clients, is not available on
these machines, so only CPU numbers are printed.
`--workload=grid` runs part 8 instead (`bench_grid.part8`): a reproduction's whole grid
(`--grid_experiment`, every method, configuration and seed, `--grid_rounds` rounds)
through `reproduce.py`, its defaults (batched trials, processes chosen for the machine)
against one run after another on `--grid_parallel` processes (default one a core), in
the same bench run: wall time, the ratio and whether the two results tables are
identical.
`--workload=aggregators` runs part 9 instead (`bench_aggregators.part9`): part 1's round
with aggregator chains (clipping + 8-bit quantization, rotation, top-k with error
feedback, the median, Krum) against the plain mean, each timed right after it; TFF's
`compression_aggregator` beside TFF's default mean, and a chain placed on TFF's runtime.
`--workload=streaming` runs part 7 instead: a StackOverflow-shaped synthetic population
(342,477 clients, lognormal sizes around the real mean of 397 sentences, 20 token ids a
sentence; generated on demand, never stored whole), FedAvg of a small bag-of-words
next-token model, 50 clients per round, streamed (`--data_memory_budget`): host RSS over
`--rounds` rounds; then streaming against resident on a population that fits (2,000
clients of the same shape).
Prints the median of --repeats timings of --rounds rounds each, and ratios; the first
(compiling) rounds are warm-up and not timed.
Part 1 also prints the machine's load average, which the ratios should be read with.
"""

import os

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
# gRPC's INFO line at each fork (the peers', Ray's processes) says nothing to a reader.
os.environ.setdefault('GRPC_VERBOSITY', 'ERROR')

import csv
import importlib.util
import subprocess
import sys
import tempfile
import time

from absl import app, flags
import psutil  # installed with TFF (portpicker requires it)
import tensorflow as tf
import tensorflow_federated as tff

from tff_comp import data as data_lib
from tff_comp import registry, runtime, settings
from tff_comp.algorithms import fedavg
from tff_comp.binaries import (
  bench_aggregators,
  bench_first_rounds,
  bench_grid,
  bench_peers,
  bench_workloads,
  closed_stdout,
  flags_lib,
  reproductions,  # noqa: F401 (registers the built-in grids: --grid_experiment)
)
from tff_comp.binaries import bench_timing as timing
from tff_comp.runtime import choice, inprocess, workers
from tff_comp.tasks import lasso, synthetic

_ROUNDS = flags.DEFINE_integer(
  'rounds', 30, 'Timed rounds per repeat.', lower_bound=1, upper_bound=settings.MAX_COUNT
)
_REPEATS = flags.DEFINE_integer(
  'repeats', 3, 'Repeats; the median is reported.', lower_bound=1, upper_bound=settings.MAX_COUNT
)
_SWEEP = flags.DEFINE_list(
  'sweep', ['10', '100', '1000'], 'Clients per round for part 2 (empty: skip part 2).'
)
_POPULATION = flags.DEFINE_integer(
  'population', 1000, 'Clients of the part 2 task.', lower_bound=1, upper_bound=settings.MAX_COUNT
)
_SWEEP_TFF_MAX = flags.DEFINE_integer(
  'sweep_tff_max',
  100,
  "Largest clients per round part 2 also times on TFF's worker.",
  lower_bound=0,
  upper_bound=settings.MAX_COUNT,
)
_TFF_WORKERS = flags.DEFINE_integer(
  'tff_workers',
  2,
  'Part 3: local TFF workers to split rounds across (0: skip).',
  lower_bound=0,
  upper_bound=settings.MAX_COUNT,
)
_FIRST_ROUNDS = flags.DEFINE_bool('first_rounds', True, 'Part 5: time to the first round.')
_RAY_ACTORS = flags.DEFINE_integer(
  'ray_actors',
  2,
  'Part 3: Ray actors of a local cluster for the Ray lines (0: skip; skipped without Ray).',
  lower_bound=0,
  upper_bound=settings.MAX_COUNT,
)
_MEMORY_ROUNDS = flags.DEFINE_integer(
  'memory_rounds',
  0,
  'Part 4: rounds to watch host memory over (0: skip).',
  lower_bound=0,
  upper_bound=settings.MAX_COUNT,
)
_WORKLOAD = flags.DEFINE_enum(
  'workload',
  'lasso',
  ['lasso', 'emnist_cnn', 'streaming', 'grid', 'aggregators'],
  'lasso: parts 1-5; emnist_cnn: part 6; streaming: part 7; grid: part 8; aggregators: part 9.',
)
_GRID_EXPERIMENT = flags.DEFINE_enum(
  'grid_experiment',
  'fco_lasso',
  registry.REPRODUCTIONS.names(),
  'Part 8: the reproduction whose grid is timed.',
)
_GRID_ROUNDS = flags.DEFINE_integer(
  'grid_rounds', 500, 'Part 8: rounds of every run.', lower_bound=1, upper_bound=settings.MAX_COUNT
)
_GRID_PARALLEL = flags.DEFINE_integer(
  'grid_parallel',
  None,
  'Part 8: the processes of the one-by-one grid (reproduce.py --nobatch_trials'
  ' --parallel) set against the defaults. Default: one a core.',
  lower_bound=1,
  upper_bound=settings.MAX_COUNT,
)
_EMNIST_CLIENTS = flags.DEFINE_integer(
  'emnist_clients', 10, 'Part 6: clients per round.', lower_bound=1, upper_bound=settings.MAX_COUNT
)
_RUN_PY_ROUNDS = flags.DEFINE_integer(
  'run_py_rounds',
  400,
  'Part 1 (e): rounds of the end-to-end run.py run (0: skip).',
  lower_bound=0,
  upper_bound=settings.MAX_COUNT,
)
flags.register_validator(
  'sweep',
  lambda values: all(v.isdigit() and int(v) > 0 for v in values),
  '--sweep takes positive whole numbers of clients per round (e.g. 10,100).',
)


CLIENTS, BATCH, LR = 10, 10, 1e-3
_HERE = os.path.dirname(os.path.abspath(__file__))


def _plain_round(model, arrays: data_lib.ClientArrays):
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
        xb, yb = x[k * BATCH : (k + 1) * BATCH], y[k * BATCH : (k + 1) * BATCH]
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
  picks = timing.selections(len(ids), CLIENTS, 3 + rounds * repeats + 10)
  process = fedavg.build_fedavg(task.model, client_learning_rate=LR, batch_size=BATCH)
  fast = inprocess.build(process, task.train_data, engine='lanes')
  mapped = inprocess.build(process, task.train_data, engine='mapped')
  worker, _ = choice.runner_for(process, task.train_data, 'tff')
  builtin = tff.learning.algorithms.build_weighted_fed_avg(
    task.model, tff.learning.optimizers.build_sgdm(LR), tff.learning.optimizers.build_sgdm(1.0)
  )
  builtin_state = [builtin.initialize()]

  def builtin_round(r):
    datasets = [task.train_data.create_tf_dataset_for_client(ids[i]).batch(BATCH) for i in picks[r]]
    builtin_state[0] = builtin.next(builtin_state[0], datasets).state

  plain = _plain_round(task.model, task.client_arrays())
  with bench_peers.Peers(
    rounds, clients=CLIENTS, batch_size=BATCH, learning_rate=LR, dim=lasso.DIM
  ) as peers:
    a, peers_a = timing.time_rounds_between(
      timing.round_runner(fast, ids, picks), rounds, repeats, peers.block
    )
    a2 = timing.time_rounds(timing.round_runner(mapped, ids, picks), rounds, repeats)
    b = timing.time_rounds(timing.round_runner(worker, ids, picks), rounds, repeats)
    c = timing.time_rounds(builtin_round, rounds, repeats)
    d = timing.time_rounds(lambda r: plain(picks[r]), rounds, repeats)
    e = e_resumed = None
    peers_e = []
    if _RUN_PY_ROUNDS.value:
      peers_e.append(peers.block())
      e, e_resumed = _run_py(_RUN_PY_ROUNDS.value)
      peers_e.append(peers.block())
  print(
    f'Part 1: FedAvg round, lasso I ({CLIENTS} clients x 128 examples, d={lasso.DIM},'
    f' batch {BATCH}, 1 epoch); median of {repeats} x {rounds} rounds; load average'
    f' {" ".join(f"{x:.2f}" for x in os.getloadavg())} at the end'
  )
  print(
    f'  (a) tff_comp fedavg, in-process lanes ({fast.device}, {fast.kernel_threads}'
    f' kernel threads)   {a:.5f} s/round'
  )
  print(f"  (a') tff_comp fedavg, in-process mapped                {a2:.4f} s/round")
  print(f'  (b) tff_comp fedavg, TFF worker                       {b:.4f} s/round')
  print(f'  (c) TFF build_weighted_fed_avg, Python data           {c:.4f} s/round')
  print(f'  (d) plain tf.function (map_fn), data in memory        {d:.4f} s/round')
  if e is not None:
    print(
      f'  (e) run.py end to end, {_RUN_PY_ROUNDS.value} rounds (lanes, no evaluation)'
      f'  {e:.5f} s/round; resumed halfway, the resumed rounds {e_resumed:.5f}'
      f' s/round ({e_resumed / e:.2f}x)'
    )
  print(
    f"  a/a' = {a / a2:.3f}   a/b = {a / b:.3f}   a/c = {a / c:.3f}   a/d = {a / d:.3f}"
    + (f'   e/a = {e / a:.3f} (target <= 1.2)' if e is not None else '')
  )
  bench_peers.report(a, e, peers_a, peers_e)
  bench_peers.report_weights(task, CLIENTS, LR)


def _run_py(rounds: int) -> tuple[float, float]:
  """(e): wall seconds per round of `run.py` on part 1's shape from its metrics.csv,
  rounds 2..`rounds` (the first round compiles); then of a run stopped at round
  `rounds` // 2 and resumed, over its resumed rounds after the first."""
  command = [
    sys.executable,
    os.path.join(_HERE, 'run.py'),
    '--algo=fedavg',
    '--task=lasso',
    '--engine=lanes',
    f'--clients_per_round={CLIENTS}',
    f'--batch_size={BATCH}',
    f'--client_learning_rate={LR}',
    '--eval_period=1000000',
  ]

  def run(output_dir: str, *args: str) -> dict[int, float]:
    subprocess.run(
      [*command, f'--output_dir={output_dir}', *args],
      check=True,
      capture_output=True,
      timeout=1800,
      stdin=subprocess.DEVNULL,
    )
    with open(os.path.join(output_dir, 'metrics.csv'), newline='') as f:
      return {int(row['round']): float(row['seconds']) for row in csv.DictReader(f)}

  half = rounds // 2
  with tempfile.TemporaryDirectory() as whole, tempfile.TemporaryDirectory() as resumed:
    seconds = run(whole, f'--rounds={rounds}')
    run(resumed, f'--rounds={half}')
    again = run(resumed, f'--rounds={rounds}', '--resume')
  return (
    (seconds[rounds] - seconds[1]) / (rounds - 1),
    (again[rounds] - again[half + 1]) / (rounds - half - 1),
  )


def part2(sweep: list[int], population: int, rounds: int, repeats: int, tff_max: int) -> None:
  task = synthetic.build_synthetic_task(num_clients=max(population, max(sweep)))
  ids = task.train_data.client_ids
  process = fedavg.build_fedavg(task.model, client_learning_rate=0.01, batch_size=BATCH)
  fast = inprocess.build(process, task.train_data, engine='lanes')
  mapped = inprocess.build(process, task.train_data, engine='mapped')
  worker = None
  sizes = [len(task.train_data.create_tf_dataset_for_client(i)) for i in ids]
  print(
    f'Part 2: FedAvg on synthetic(1,1), {len(ids)} clients (sizes'
    f' {min(sizes)}-{max(sizes)}), batch {BATCH}, 1 epoch'
  )
  for per_round in sweep:
    picks = timing.selections(len(ids), per_round, 3 + rounds * repeats + 10)
    a = timing.time_rounds(timing.round_runner(fast, ids, picks), rounds, repeats)
    a2 = timing.time_rounds(timing.round_runner(mapped, ids, picks), rounds, repeats)
    line = (
      f'  {per_round:5d} clients/round: lanes {a:.4f} s/round'
      f' ({1000 * a / per_round:.3f} ms/client); mapped {a2:.4f} s/round'
      f' ({1000 * a2 / per_round:.3f} ms/client)'
    )
    if per_round <= tff_max:
      if worker is None:
        worker, _ = choice.runner_for(process, task.train_data, 'tff')
      b = timing.time_rounds(timing.round_runner(worker, ids, picks), rounds, repeats)
      line += (
        f'; TFF worker {b:.4f} s/round ({1000 * b / per_round:.3f} ms/client); ratio {a / b:.3f}'
      )
    print(line, flush=True)


def part3(num_workers: int, rounds: int, repeats: int) -> None:
  task = lasso.build_lasso_task(dataset='I')
  ids = task.train_data.client_ids
  picks = timing.selections(len(ids), CLIENTS, 3 + rounds * repeats + 10)
  process = fedavg.build_fedavg(task.model, client_learning_rate=LR, batch_size=BATCH)
  one, _ = choice.runner_for(process, task.train_data, 'tff')
  b = timing.time_rounds(timing.round_runner(one, ids, picks), rounds, repeats)
  addresses, processes = workers.start_local_workers(num_workers)
  try:
    split, _ = choice.runner_for(process, task.train_data, 'tff', workers=addresses)
    e = timing.time_rounds(timing.round_runner(split, ids, picks), rounds, repeats)
  finally:
    for worker in processes:
      worker.kill()
    runtime.install_local_runtime()
  print(
    f"Part 3: part 1's (b) on {num_workers} local TFF workers (mergeable context)"
    f' {e:.4f} s/round vs one worker {b:.4f}: speedup {b / e:.2f}x'
  )


def part4(rounds: int, per_round: int) -> None:
  task = synthetic.build_synthetic_task(num_clients=per_round)
  ids = task.train_data.client_ids
  process = fedavg.build_fedavg(task.model, client_learning_rate=0.01, batch_size=BATCH)
  run_round = timing.round_runner(
    inprocess.build(process, task.train_data, engine='lanes'),
    ids,
    timing.selections(len(ids), per_round, rounds),
  )
  me, rss, start = psutil.Process(), {}, time.perf_counter()
  for r in range(rounds):
    run_round(r)
    if r + 1 in (1, 50) or (r + 1) % 100 == 0 or r + 1 == rounds:
      rss[r + 1] = me.memory_info().rss / 2**20
  seconds = time.perf_counter() - start
  base = rss[min(50, rounds)]
  print(
    f'Part 4: host memory over {rounds} rounds of {per_round} clients (synthetic, lanes),'
    f' {seconds:.0f} s: '
    + ', '.join(f'round {r} {m:.0f} MB' for r, m in rss.items())
    + f'; growth from round {min(50, rounds)}: {100 * (rss[rounds] / base - 1):+.1f}%'
    ' (target < 5%)'
  )


@closed_stdout.closing_stdout_quietly
def main(argv):
  if len(argv) > 1:
    flags_lib.fail(f'unexpected arguments: {" ".join(argv[1:])}')
  flags_lib.quiet_logs()
  runtime.install_local_runtime()
  if _WORKLOAD.value == 'emnist_cnn':
    bench_workloads.part6(_ROUNDS.value, _REPEATS.value, _EMNIST_CLIENTS.value)
    return
  if _WORKLOAD.value == 'streaming':
    bench_workloads.part7(_ROUNDS.value, _REPEATS.value)
    return
  if _WORKLOAD.value == 'grid':
    bench_grid.part8(_GRID_EXPERIMENT.value, _GRID_ROUNDS.value, _GRID_PARALLEL.value)
    return
  if _WORKLOAD.value == 'aggregators':
    bench_aggregators.part9(_ROUNDS.value, _REPEATS.value)
    return
  part1(_ROUNDS.value, _REPEATS.value)
  if _SWEEP.value:
    part2(
      [int(v) for v in _SWEEP.value],
      _POPULATION.value,
      max(3, _ROUNDS.value // 5),
      _REPEATS.value,
      _SWEEP_TFF_MAX.value,
    )
  if _TFF_WORKERS.value:
    part3(_TFF_WORKERS.value, _ROUNDS.value, _REPEATS.value)
  if _RAY_ACTORS.value and importlib.util.find_spec('ray'):
    from tff_comp.binaries import bench_ray

    bench_ray.part3_ray(_RAY_ACTORS.value, _ROUNDS.value, _REPEATS.value)
  if _MEMORY_ROUNDS.value:
    part4(_MEMORY_ROUNDS.value, _POPULATION.value)
  if _FIRST_ROUNDS.value:
    bench_first_rounds.part5()


if __name__ == '__main__':
  app.run(main, flags_parser=flags_lib.parse_or_fail)
