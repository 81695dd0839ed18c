r"""pfl-research's FedAvg on bench part 1's shape, for same-run comparisons (`make bench-peers`).

    .venv-pfl/bin/python binaries/peers/pfl_fedavg.py [--rounds=30] [--repeats=3]

Runs in pfl's own virtual environment (requirements/pfl.txt), never imported by
tff_comp. pfl 0.6 with its PyTorch backend: the backend its benchmarks and docs lead
with, and the one that installs here from the CPU build of PyTorch on this machine's
disk (its TensorFlow backend needs TensorFlow >= 2.16, a second TensorFlow beside
TFF's 2.14). Its own simulation loop as its docs run it: `FederatedAveraging.run` over
a `SimulatedBackend`, a `PyTorchModel` with SGD on the clients and SGD at 1.0 on the
server, one process (pfl's multi-process mode shards a cohort across processes, for
GPUs; on 2 cores one process already uses both through PyTorch's threads).

`--workload=lasso`: linear regression with d inputs and a bias (loss 0.5 * mean
squared error), `--clients` clients a round from 64 clients of 128 examples, batch
`--batch_size`, one epoch at `--learning_rate`: lasso I's FedAvg round as
`binaries/bench.py` part 1 times it. `--workload=cnn`: part 6's EMNIST CNN
(`torch_cnn.py`) on its synthetic clients. Each client's examples are held as PyTorch
tensors (2026-12-05: 0.028 s a lasso round against 0.030 from NumPy arrays; PyTorchModel's
`use_torch_compile` gave 0.029).
`--serve` and `--check` as `protocol.py` says; without them, prints the median of
`--repeats` timings of `--rounds` rounds after three rounds of warm-up.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from pfl.aggregate.simulate import SimulatedBackend
from pfl.algorithm import FederatedAveraging, NNAlgorithmParams
from pfl.callback.base import TrainingProcessCallback
from pfl.data.federated_dataset import FederatedDataset
from pfl.hyperparam import NNTrainHyperParams
from pfl.metrics import Metrics
from pfl.model.pytorch import PyTorchModel
import protocol
import torch
import torch_cnn


class Regression(torch.nn.Module):
  """y = <w, x> + b; pfl's PyTorchModel asks a module for `loss` and `metrics`."""

  def __init__(self, dim: int):
    super().__init__()
    self.linear = torch.nn.Linear(dim, 1)

  def forward(self, x):
    return self.linear(x)[:, 0]

  def loss(self, x, y, eval=False):  # noqa: A002 (pfl's keyword)
    return 0.5 * torch.mean(torch.square(self(x) - y))

  def metrics(self, x, y, eval=False):  # noqa: A002
    return {}


class _AfterRound(TrainingProcessCallback):
  """Ends pfl's loop when `keep_going()` says so (its stop signal)."""

  def __init__(self, keep_going):
    self._keep_going = keep_going

  def after_central_iteration(self, aggregate_metrics, model, *, central_iteration):
    return not self._keep_going(), Metrics()


def _run(module, data, sample, cohort: int, lr: float, batch: int, rounds: int, keep_going):
  """pfl's FedAvg of `module` over `data` (a list of (x, y) tensors); clients drawn
  by `sample()`."""
  arrays = {str(i): [x, y] for i, (x, y) in enumerate(data)}
  model = PyTorchModel(
    model=module,
    local_optimizer_create=torch.optim.SGD,
    central_optimizer=torch.optim.SGD(module.parameters(), lr=1.0),
  )
  backend = SimulatedBackend(
    training_data=FederatedDataset.from_slices(arrays, lambda: str(sample())),
    val_data=None,
  )
  FederatedAveraging().run(
    algorithm_params=NNAlgorithmParams(
      central_num_iterations=rounds,
      evaluation_frequency=rounds + 1,
      train_cohort_size=cohort,
      val_cohort_size=None,
    ),
    backend=backend,
    model=model,
    model_train_params=NNTrainHyperParams(
      local_num_epochs=1, local_learning_rate=lr, local_batch_size=batch
    ),
    callbacks=[_AfterRound(keep_going)],
    send_metrics_to_platform=False,
  )


def main() -> None:
  args = protocol.parse_args()
  if args.check:
    inputs, output = args.check.split(',')
    given = protocol.read_check(inputs)
    order = iter(given['picks'].reshape(-1))
    module = Regression(given['x'].shape[2])
    with torch.no_grad():
      module.linear.weight.copy_(torch.from_numpy(given['kernel'].reshape(1, -1)))
      module.linear.bias.fill_(float(given['bias']))
    _run(
      module,
      [(torch.from_numpy(x), torch.from_numpy(y)) for x, y in zip(given['x'], given['y'])],
      lambda: int(next(order)),
      given['picks'].shape[1],
      float(given['learning_rate']),
      int(given['batch_size']),
      len(given['picks']),
      lambda: True,
    )
    protocol.write_weights(output, module.linear.weight.detach().numpy(), module.linear.bias.item())
    return
  clients = protocol.workload(args)
  picks = protocol.selections(args.clients, len(clients))
  cohort_left = []

  def sample() -> int:
    """pfl samples a cohort one client at a time: each round's draw, in turn."""
    if not cohort_left:
      cohort_left.extend(next(picks))
    return cohort_left.pop()

  blocks = protocol.Blocks(args)
  if args.workload == 'lasso':
    module, data = (
      Regression(args.dim),
      [(torch.from_numpy(x), torch.from_numpy(y)) for x, y in clients],
    )
  else:
    module, data = (
      torch_cnn.CNN(protocol.CNN_CLASSES),
      [torch_cnn.tensors(x, y) for x, y in clients],
    )
  _run(
    module,
    data,
    sample,
    args.clients,
    args.learning_rate,
    args.batch_size,
    10**9,
    blocks.after_round,
  )
  if not args.serve:
    print(f'pfl fedavg ({args.workload}) s/round {blocks.median():.6f}')


if __name__ == '__main__':
  main()
