"""What every peer script shares with `binaries/bench.py` (`bench_peers.Peer`): the
flags, part 1's data, the serve protocol and the weights check. NumPy and the standard
library only: it is imported by each peer in its own virtual environment, never by
tff_comp.

Serve protocol (`--serve`): the peer warms up (three rounds), prints `ready`, then
reads a number of rounds a line from stdin, runs them and prints their seconds a
round, until stdin closes; the bench times its blocks between its own, so that both
meet the machine in the same minutes.

Check (`--check=IN.npz,OUT.npz`): the peer reads clients' data, the initial weights,
the clients of each round, the learning rate and the batch size from IN, runs those
rounds of FedAvg with each client's examples in their stored order, and writes its
kernel and bias to OUT, which the bench compares with tff_comp's after the same rounds.
"""

import argparse
from collections.abc import Callable, Iterator
import sys
import time

import numpy as np

NUM_CLIENTS, EXAMPLES = 64, 128
# Part 6's EMNIST-shaped workload: 28x28x1 images of 62 classes, about 224 examples a
# client (as EMNIST's writers), a population of twice the clients a round.
CNN_CLASSES, CNN_SIZES = 62, (180, 269)


def parse_args() -> argparse.Namespace:
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
  parser.add_argument('--workload', choices=('lasso', 'cnn'), default='lasso')
  parser.add_argument('--serve', action='store_true')
  parser.add_argument('--check', default=None, help='IN.npz,OUT.npz')
  return parser.parse_args()


def clients(dim: int) -> list[tuple[np.ndarray, np.ndarray]]:
  """Part 1's shape: 64 clients of 128 examples, y = <w, x> with w ~ N(0, I)."""
  rng = np.random.default_rng(0)
  w = rng.normal(size=dim).astype(np.float32)
  data = []
  for _ in range(NUM_CLIENTS):
    x = rng.normal(size=(EXAMPLES, dim)).astype(np.float32)
    data.append((x, (x @ w).astype(np.float32)))
  return data


def cnn_clients(population: int) -> list[tuple[np.ndarray, np.ndarray]]:
  """Part 6's clients (`bench_workloads.part6` draws the same): random NHWC images in
  [0, 1) and random labels."""
  rng = np.random.default_rng(0)
  data = []
  for _ in range(population):
    n = int(rng.integers(*CNN_SIZES))
    data.append((rng.random((n, 28, 28, 1), np.float32), rng.integers(0, CNN_CLASSES, n)))
  return [(x, y.astype(np.int32)) for x, y in data]


def population(args: argparse.Namespace) -> int:
  """The clients of `--workload`: part 1's 64, or part 6's twice `--clients`."""
  return NUM_CLIENTS if args.workload == 'lasso' else 2 * args.clients


def workload(args: argparse.Namespace) -> list[tuple[np.ndarray, np.ndarray]]:
  """The clients' data of `--workload`."""
  return clients(args.dim) if args.workload == 'lasso' else cnn_clients(population(args))


def selections(clients_per_round: int, population: int = NUM_CLIENTS) -> Iterator[list[int]]:
  """Each round's clients, drawn without replacement (the same draws for every peer)."""
  rng = np.random.default_rng(1)
  while True:
    yield [int(i) for i in rng.choice(population, clients_per_round, replace=False)]


def read_check(path: str) -> dict[str, np.ndarray]:
  """The check's inputs: x [clients, n, d], y [clients, n], kernel [d], bias [],
  picks [rounds, per_round], learning_rate [], batch_size []."""
  with np.load(path) as data:
    return {name: data[name] for name in data.files}


def write_weights(path: str, kernel, bias) -> None:
  np.savez(path, kernel=np.asarray(kernel, np.float32).reshape(-1), bias=np.float32(bias))


class Blocks:
  """Blocks of timed rounds, for a peer whose own loop calls back after each round
  (pfl's callbacks, Flower's evaluate_fn) or whose rounds the script calls (`drive`).
  With `serve`, each block's length is read from stdin and its seconds a round
  printed (the serve protocol); otherwise `repeats` blocks of `rounds` run and
  `median()` is their median. `after_round()` returns False when no block is left."""

  def __init__(self, args: argparse.Namespace, warmup: int = 3):
    self._serve, self._warmup = args.serve, warmup
    self._requests = iter([args.rounds] * args.repeats)
    self._left, self._rounds, self._start = 0, 0, 0.0
    self.timings: list[float] = []

  def after_round(self) -> bool:
    if self._warmup > 0:
      self._warmup -= 1
      if self._warmup > 0:
        return True
      if self._serve:
        print('ready', flush=True)
      return self._next()
    self._left -= 1
    if self._left > 0:
      return True
    self.timings.append((time.perf_counter() - self._start) / self._rounds)
    if self._serve:
      print(f'{self.timings[-1]:.6f}', flush=True)
    return self._next()

  def _next(self) -> bool:
    if self._serve:
      line = sys.stdin.readline()
      rounds = int(line) if line else None
    else:
      rounds = next(self._requests, None)
    if rounds is None:
      return False
    self._left = self._rounds = rounds
    self._start = time.perf_counter()
    return True

  def median(self) -> float:
    return float(np.median(self.timings))


def drive(run_round: Callable[[], None], blocks: Blocks) -> None:
  """Runs rounds until `blocks` has none left."""
  run_round()
  while blocks.after_round():
    run_round()
