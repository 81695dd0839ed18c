r"""Flower's FedAvg on bench part 1's shape, for same-run comparisons (`make bench-peers`).

    .venv-flower/bin/python binaries/peers/flower_fedavg.py [--rounds=30] [--repeats=3]

Runs in Flower's own virtual environment (requirements/flower.txt), never imported by
tff_comp. Flower 1.42's simulation runtime as its docs run it: `run_simulation` with
its Ray backend, a `ServerApp` running the `FedAvg` strategy (`Strategy.start`) and a
NumPy `ClientApp` (Flower's NumPy template): each of 64 virtual SuperNodes holds one
client of 128 examples and trains it with NumPy SGD. Speed settings, from Flower's
simulation guide: one CPU a client (`client_resources`; the default two would run one
client at a time on this machine), client-side evaluation off (`fraction_evaluate=0`),
Flower's per-round INFO log lines off (`flwr` logger at WARNING).

Linear regression with d inputs and a bias (loss 0.5 * mean squared error), `--clients`
clients a round (Flower samples them), batch `--batch_size`, one epoch at
`--learning_rate`: lasso I's FedAvg round as `binaries/bench.py` part 1 times it.
`--serve` and `--check` as `protocol.py` says (check: one SuperNode per client of a
round, each told by the round number which client it plays); without them, prints the
median of `--repeats` timings of `--rounds` rounds after three rounds of warm-up.
"""

import logging
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from flower_client import client_app
from flwr.app import ArrayRecord, ConfigRecord, Context
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg
from flwr.simulation import run_simulation
import numpy as np
import protocol
import torch_cnn

_HERE = os.path.dirname(os.path.abspath(__file__))
ARGS = protocol.parse_args()
server_app = ServerApp()


class _Done(Exception):
  """No block of rounds is left (stdin closed, or the last repeat ran)."""


@server_app.main()
def main(grid: Grid, context: Context) -> None:
  if ARGS.check:
    inputs, output = ARGS.check.split(',')
    given = protocol.read_check(inputs)
    rounds, nodes = given['picks'].shape
    result = FedAvg(
      fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=nodes, min_available_nodes=nodes
    ).start(
      grid=grid,
      initial_arrays=ArrayRecord([given['kernel'], np.asarray(given['bias'], np.float32)]),
      num_rounds=rounds,
      train_config=ConfigRecord(
        {
          'lr': float(given['learning_rate']),
          'batch': int(given['batch_size']),
          'dim': given['x'].shape[2],
          'workload': 'lasso',
          'population': nodes,
          'check': inputs,
        }
      ),
    )
    protocol.write_weights(output, *result.arrays.to_numpy_ndarrays())
    return
  blocks = protocol.Blocks(ARGS)
  population = _population()
  if ARGS.workload == 'lasso':
    initial = [np.zeros(ARGS.dim, np.float32), np.zeros((), np.float32)]
  else:
    initial = [v.numpy() for v in torch_cnn.CNN(protocol.CNN_CLASSES).state_dict().values()]

  def after_round(server_round: int, arrays: ArrayRecord) -> None:
    if server_round and not blocks.after_round():
      raise _Done

  try:
    FedAvg(
      fraction_train=ARGS.clients / population,
      fraction_evaluate=0.0,
      min_train_nodes=ARGS.clients,
      min_available_nodes=population,
    ).start(
      grid=grid,
      initial_arrays=ArrayRecord(initial),
      num_rounds=10**9,
      train_config=ConfigRecord(
        {
          'lr': ARGS.learning_rate,
          'batch': ARGS.batch_size,
          'dim': ARGS.dim,
          'workload': ARGS.workload,
          'population': population,
          'check': '',
        }
      ),
      evaluate_fn=after_round,
    )
  except _Done:
    pass
  if not ARGS.serve:
    print(f'flower fedavg ({ARGS.workload}) s/round {blocks.median():.6f}', flush=True)


def _population() -> int:
  """The SuperNodes: one a client (`--check`: one a client of a round)."""
  if ARGS.check:
    return protocol.read_check(ARGS.check.split(',')[0])['picks'].shape[1]
  return protocol.population(ARGS)


if __name__ == '__main__':
  # Ray's actors, started by run_simulation from this process, import flower_client.
  os.environ['PYTHONPATH'] = os.pathsep.join(filter(None, [_HERE, os.environ.get('PYTHONPATH')]))
  logging.getLogger('flwr').setLevel(logging.WARNING)
  run_simulation(
    server_app=server_app,
    client_app=client_app,
    num_supernodes=_population(),
    backend_config={'client_resources': {'num_cpus': 1, 'num_gpus': 0.0}},
  )
