"""The `ClientApp` of `flower_fedavg.py` (a module of its own: Ray's actors import a
ClientApp by module, and cannot find one defined in a script's `__main__`): NumPy SGD
on part 1's linear model (Flower's NumPy template), PyTorch SGD on part 6's CNN
(Flower's PyTorch template). What a client needs arrives in the round's ConfigRecord:
the workload, the learning rate, the batch size, the dimension and, for `--check`, the
inputs' file (empty otherwise)."""

import functools

from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
import numpy as np
import protocol
import torch
import torch_cnn

client_app = ClientApp()


@functools.cache
def _data(workload: str, dim: int, population: int, check: str) -> list:
  """Every client's (x, y), made or read once in each Ray actor (the CNN's as tensors)."""
  if check:
    given = protocol.read_check(check)
    return list(zip(given['x'], given['y']))
  if workload == 'lasso':
    return protocol.clients(dim)
  return [torch_cnn.tensors(x, y) for x, y in protocol.cnn_clients(population)]


@functools.cache
def _cnn() -> torch_cnn.CNN:
  return torch_cnn.CNN(protocol.CNN_CLASSES)


def _train_cnn(arrays: list[np.ndarray], x, y, lr: float, batch: int) -> list[np.ndarray]:
  """One epoch of PyTorch SGD from `arrays` (the state dict's, in order), examples in
  order (Flower's PyTorch template shuffles; order does not change a round's cost)."""
  model = _cnn()
  model.load_state_dict({k: torch.from_numpy(a) for k, a in zip(model.state_dict(), arrays)})
  optimizer = torch.optim.SGD(model.parameters(), lr=lr)
  for start in range(0, len(y), batch):
    optimizer.zero_grad()
    model.loss(x[start : start + batch], y[start : start + batch]).backward()
    optimizer.step()
  return [v.detach().numpy().copy() for v in model.state_dict().values()]


@functools.cache
def _picks(check: str) -> np.ndarray:
  return protocol.read_check(check)['picks']


def _sgd(kernel, bias, x, y, lr: float, batch: int):
  """One epoch of minibatch SGD on 0.5 * mean squared error, examples in order."""
  for start in range(0, len(y), batch):
    xb, yb = x[start : start + batch], y[start : start + batch]
    residual = (xb @ kernel + bias - yb) / len(yb)
    kernel = kernel - lr * (xb.T @ residual)
    bias = bias - lr * residual.sum()
  return kernel, bias


@client_app.train()
def train(msg: Message, context: Context) -> Message:
  arrays = msg.content['arrays'].to_numpy_ndarrays()
  config = msg.content['config']
  client, check = int(context.node_config['partition-id']), str(config['check'])
  if check:  # one SuperNode per client of a round: the round says which it plays
    client = int(_picks(check)[int(config['server-round']) - 1][client])
  workload, lr, batch = str(config['workload']), float(config['lr']), int(config['batch'])
  x, y = _data(workload, int(config['dim']), int(config['population']), check)[client]
  if workload == 'lasso':
    kernel, bias = _sgd(*arrays, x, y, lr, batch)
    arrays = [kernel, np.asarray(bias, np.float32)]
  else:
    arrays = _train_cnn(arrays, x, y, lr, batch)
  return Message(
    content=RecordDict(
      {
        'arrays': ArrayRecord(arrays),
        'metrics': MetricRecord({'num-examples': len(y)}),
      }
    ),
    reply_to=msg,
  )
