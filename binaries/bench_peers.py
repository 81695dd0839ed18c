"""FedJAX beside the bench (`bench.py --fedjax_python`, part 1): its FedAvg on part 1's
shape in FedJAX's own virtual environment, timed in blocks of rounds that alternate
with the bench's own."""

import os
import subprocess
import tempfile

_HERE = os.path.dirname(os.path.abspath(__file__))


class FedJAX:
  """FedJAX's FedAvg on part 1's shape, running beside the bench in `--fedjax_python`
  (`binaries/peers/fedjax_fedavg.py --serve`): `block()` times `rounds` of its rounds
  (s/round); without a `python` (FedJAX's interpreter), None. Its process is killed on
  exit. `shape`: clients, batch size, learning rate and dimension."""

  def __init__(self, python: str, rounds: int, *, clients: int, batch: int, lr: float, dim: int):
    self._python, self._rounds, self._process = python, rounds, None
    self._shape = (clients, batch, lr, dim)
    self._log = tempfile.TemporaryFile('w+')  # its stderr (a pipe left unread could fill)

  def __enter__(self) -> 'FedJAX':
    if self._python:
      clients, batch, lr, dim = self._shape
      self._process = subprocess.Popen(
        [
          self._python,
          os.path.join(_HERE, 'peers', 'fedjax_fedavg.py'),
          '--serve',
          f'--clients={clients}',
          f'--batch_size={batch}',
          f'--learning_rate={lr}',
          f'--dim={dim}',
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=self._log,
        text=True,
      )
      if self._process.stdout.readline().strip() != 'ready':
        self._failed()
    return self

  def block(self) -> float | None:
    if self._process is None:
      return None
    self._process.stdin.write(f'{self._rounds}\n')
    self._process.stdin.flush()
    line = self._process.stdout.readline()
    if not line:
      self._failed()
    return float(line)

  def _failed(self) -> None:
    code = self._process.wait()
    self._log.seek(0)
    raise RuntimeError(f'FedJAX failed (exit {code}): {self._log.read()[-2000:]}')

  def __exit__(self, *exc) -> None:
    if self._process is not None:
      self._process.kill()
      self._process.wait()
    self._log.close()
