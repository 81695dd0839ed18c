r"""FedJAX's FedAvg on bench part 1's shape, for same-run comparisons (`make bench-peers`).

    .venv-fedjax/bin/python binaries/peers/fedjax_fedavg.py [--rounds=30] [--repeats=3]

Runs in FedJAX's own virtual environment (requirements/fedjax.txt), never imported by
tff_comp. Linear regression with d inputs and a bias (squared loss), `--clients`
clients a round drawn from 64 clients of 128 examples, batch `--batch_size`, one epoch
of client SGD at `--learning_rate`, server SGD at 1.0: lasso I's FedAvg round as
`binaries/bench.py` part 1 times it. FedJAX shuffles each client's examples (as
tff_comp does by default). Prints the median of `--repeats` timings of `--rounds`
rounds, after three rounds of warm-up (compiling), as its last word.

With `--serve` (how `binaries/bench.py` runs it), it warms up, prints `ready`, then reads
a number of rounds a line from stdin, runs them and prints their seconds per round, until
stdin closes: the bench times FedJAX's blocks of rounds between its own, so that both
meet the machine in the same minutes.
"""

import argparse
import itertools
import statistics
import sys
import time

import fedjax
import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np

NUM_CLIENTS, EXAMPLES = 64, 128


def main() -> None:
  parser = argparse.ArgumentParser()
  for name, kind, default in (
    ('rounds', int, 30),
    ('repeats', int, 3),
    ('clients', int, 10),
    ('batch_size', int, 10),
    ('learning_rate', float, 1e-3),
    ('dim', int, 1024),
  ):
    parser.add_argument(f'--{name}', type=kind, default=default)
  parser.add_argument('--serve', action='store_true')
  args = parser.parse_args()
  rng = np.random.default_rng(0)
  w = rng.normal(size=args.dim).astype(np.float32)
  clients = {}
  for i in range(NUM_CLIENTS):
    x = rng.normal(size=(EXAMPLES, args.dim)).astype(np.float32)
    clients[str(i).encode()] = {'x': x, 'y': (x @ w).astype(np.float32)}
  data = fedjax.InMemoryFederatedData(clients)

  def forward(batch):
    return hk.Linear(1)(batch['x'])[:, 0]

  model = fedjax.create_model_from_haiku(
    hk.transform(forward),
    {'x': np.zeros((1, args.dim), np.float32)},
    train_loss=lambda batch, prediction: 0.5 * jnp.square(prediction - batch['y']),
  )
  algorithm = fedjax.algorithms.fed_avg.federated_averaging(
    fedjax.model_grad(model),
    fedjax.optimizers.sgd(args.learning_rate),
    fedjax.optimizers.sgd(1.0),
    fedjax.ShuffleRepeatBatchHParams(batch_size=args.batch_size, num_epochs=1),
  )
  state = algorithm.init(model.init(jax.random.PRNGKey(0)))
  picks = np.random.default_rng(1)
  keys = (jax.random.fold_in(jax.random.PRNGKey(1), r) for r in itertools.count())

  def run_round():
    nonlocal state
    ids = [str(i).encode() for i in picks.choice(NUM_CLIENTS, args.clients, replace=False)]
    state, _ = algorithm.apply(
      state,
      [
        (cid, dataset, key)
        for (cid, dataset), key in zip(
          data.get_clients(ids), jax.random.split(next(keys), len(ids))
        )
      ],
    )
    jax.block_until_ready(state.params)

  for _ in range(3):
    run_round()
  if args.serve:
    print('ready', flush=True)
    for line in sys.stdin:
      start = time.perf_counter()
      for _ in range(int(line)):
        run_round()
      print(f'{(time.perf_counter() - start) / int(line):.6f}', flush=True)
    return
  timings = []
  for _ in range(args.repeats):
    start = time.perf_counter()
    for _ in range(args.rounds):
      run_round()
    timings.append((time.perf_counter() - start) / args.rounds)
  print(f'fedjax fedavg s/round {statistics.median(timings):.6f}')


if __name__ == '__main__':
  main()
