"""`bench.py --ray_actors=N` (part 3, Ray lines): a round with its clients on N Ray
actors of a local cluster against the same round in one process, on part 1's lasso
shape and on the EMNIST CNN (part 6's synthetic clients), with what each round sends
and receives and the driver's share (`ray_runtime.RoundCosts`)."""

import statistics

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_comp import keras_models
from tff_comp.algorithms import fedavg, scaffold
from tff_comp.binaries import bench_timing as timing
from tff_comp.runtime import client_rows, inprocess
from tff_comp.runtime import ray as ray_runtime
from tff_comp.runtime.ray import cluster as ray_cluster
from tff_comp.tasks import emnist, lasso


def _emnist(clients: int):
  """(a FedAvg builder of the EMNIST CNN, synthetic EMNIST-shaped client data)."""
  rng = np.random.default_rng(0)
  data = tff.simulation.datasets.TestClientData(
    {
      f'w{i}': (rng.random((n, 28, 28, 1), np.float32), rng.integers(0, 62, n).astype(np.int32))
      for i, n in enumerate(rng.integers(180, 269, clients))
    }
  )
  spec = (tf.TensorSpec([None, 28, 28, 1], tf.float32), tf.TensorSpec([None], tf.int32))
  loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
  return (
    lambda: fedavg.build_fedavg(
      keras_models.from_keras(emnist.cnn(62), loss, spec), client_learning_rate=0.02, batch_size=20
    )
  ), data


def part3_ray(actors: int, rounds: int, repeats: int, per_round: int = 10) -> None:
  ray_cluster.connect(ray_cluster.LOCAL)
  task = lasso.build_lasso_task(dataset='I')
  population = len(task.train_data.client_ids)
  workloads = (
    (
      'lasso I shape',
      lambda: fedavg.build_fedavg(task.model, client_learning_rate=1e-3, batch_size=10),
      task.train_data,
      'lanes',
    ),
    (
      'lasso I shape, SCAFFOLD (its c_i with the actors)',
      lambda: scaffold.scaffold(
        task.model, num_clients=population, client_learning_rate=1e-3, batch_size=10
      ),
      task.train_data,
      'lanes',
    ),
    ('EMNIST CNN', *_emnist(2 * per_round), 'mapped'),
  )
  print(
    f'Part 3, Ray: {per_round} clients a round on {actors} actors of a local Ray'
    ' cluster (this machine) against one process, the same engine'
  )
  for label, build, data, engine in workloads:
    ids = list(data.client_ids)
    picks = timing.selections(len(ids), per_round, 3 + rounds * repeats + 10)
    one = timing.time_rounds(
      timing.round_runner(inprocess.build(build(), data, engine=engine), ids, picks),
      rounds,
      repeats,
    )
    runtime = ray_runtime.build(
      build(), data, ray_runtime.RayOptions(ray_cluster.LOCAL, actors), engine=engine
    )
    runtime.reserve_cohort(per_round)
    costs = []
    run_round = timing.round_runner(runtime, ids, picks)

    def measured(r, run_round=run_round, runtime=runtime):
      run_round(r)
      costs.append(runtime.costs)  # noqa: B023 (called in this iteration)

    on_ray = timing.time_rounds(measured, rounds, repeats)
    mean = ray_runtime.RoundCosts(*(statistics.mean(c[i] for c in costs[3:]) for i in range(4)))
    print(
      f'  {label} ({engine}): {on_ray:.4f} s/round on {actors} actors vs {one:.4f} in'
      f' one process ({on_ray / one:.2f}x); a round sends {mean.sent / 1e3:,.0f} kB'
      f' and receives {mean.received / 1e3:,.0f} kB; the clients take'
      f" {mean.clients_seconds * 1e3:.1f} ms, the driver's round end"
      f' {mean.driver_seconds * 1e3:.1f} ms{_client_state(runtime, ids[:per_round])}'
    )


def _client_state(runtime: ray_runtime.RayRuntime, cohort) -> str:
  """Where a round's state keeps its client state: the bytes of the driver's state
  against the state gathered whole ('' without client state)."""
  state = runtime.next(runtime.initialize(), cohort).state
  whole = runtime.whole_state(state)
  if whole is state:
    return ''

  def size(structure) -> int:
    return sum(
      np.asarray(leaf).nbytes
      for leaf in tf.nest.flatten(structure)
      if not isinstance(leaf, client_rows.Held)
    )

  return (
    f"; the driver's state {size(state) / 1e3:,.0f} kB, the actors hold"
    f' {(size(whole) - size(state)) / 1e3:,.0f} kB of client state'
  )
