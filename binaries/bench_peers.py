"""Peers beside the bench (`bench.py --fedjax_python --pfl_python --flower_python`,
part 1): each peer's FedAvg on part 1's shape in its own virtual environment
(`binaries/peers/*_fedavg.py`, `make bench-peers` builds them), timed in blocks of
rounds that alternate with the bench's own, and its weights after two rounds set
against tff_comp's on the same data (`check`)."""

import contextlib
import ctypes
import dataclasses
import os
import signal
import subprocess
import tempfile

from absl import flags
import numpy as np

from tff_comp.algorithms import fedavg
from tff_comp.binaries import bench_timing as timing
from tff_comp.runtime import inprocess

_HERE = os.path.dirname(os.path.abspath(__file__))


@dataclasses.dataclass(frozen=True)
class PeerKind:
  """A peer: its flag (`--<name>_python`), the name printed, its script in
  binaries/peers/, the module its Python must import, its Makefile environment."""

  name: str
  label: str
  script: str
  module: str
  venv: str


KINDS = (
  PeerKind('fedjax', 'FedJAX', 'fedjax_fedavg.py', 'fedjax', '.venv-fedjax'),
  PeerKind('pfl', 'pfl-research', 'pfl_fedavg.py', 'pfl', '.venv-pfl'),
  PeerKind('flower', 'Flower', 'flower_fedavg.py', 'flwr', '.venv-flower'),
)
PYTHONS = {
  kind.name: flags.DEFINE_string(
    f'{kind.name}_python',
    None,
    f'Part 1: a Python with {kind.label} installed (`make bench-peers` builds {kind.venv});'
    f" {kind.label}'s FedAvg is timed in the same run. None: not timed.",
  )
  for kind in KINDS
}


def _validator(kind: PeerKind):
  def imports(path: str | None) -> bool:
    """A Python that imports the peer (tried once, before any part runs: a file that is
    not one failed only when part 1 started it)."""
    if path is None:
      return True
    hint = f'`make {kind.venv}/.installed` builds {kind.venv}/bin/python'
    try:
      done = subprocess.run(
        [path, '-c', f'import {kind.module}; print("{kind.module}")'],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
      )
    except (OSError, subprocess.TimeoutExpired) as e:
      raise flags.ValidationError(
        f'cannot be run ({getattr(e, "strerror", None) or e}); {hint}.'
      ) from e
    if done.returncode or done.stdout.strip() != kind.module:
      said = (done.stderr.strip().splitlines() or [f'exit {done.returncode}, no answer'])[-1]
      raise flags.ValidationError(f'is not a Python that imports {kind.module} ({said}); {hint}.')
    return True

  return imports


for _kind in KINDS:
  flags.register_validator(f'{_kind.name}_python', _validator(_kind))


def _command(kind: PeerKind, python: str, *args: str) -> list[str]:
  return [python, os.path.join(_HERE, 'peers', kind.script), *args]


def _die_with_parent() -> None:
  """In the peer's process: SIGKILL when the bench's process dies (Linux's
  PR_SET_PDEATHSIG): a bench killed outright leaves no peer waiting on its stdin."""
  ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG


class Peer:
  """A peer's FedAvg running beside the bench (`--serve`): `block()` times `rounds` of
  its rounds (s/round). `close()` closes its stdin, which ends its loop (Flower's then
  shuts its Ray cluster down), and kills its process group (Ray's processes included)
  if it has not exited a minute later. Idle between blocks, Flower's Ray processes take
  about 5% of a core in wakeups; stopping them (SIGSTOP) did not change (a)'s time and
  doubled Flower's next block (2026-12-05), so they run."""

  def __init__(self, kind: PeerKind, python: str, rounds: int, shape: dict[str, float]):
    self.kind, self._rounds = kind, rounds
    self._log = tempfile.TemporaryFile('w+')  # its stderr (a pipe left unread could fill)
    self._process = subprocess.Popen(
      _command(kind, python, '--serve', *(f'--{k}={v}' for k, v in shape.items())),
      stdin=subprocess.PIPE,
      stdout=subprocess.PIPE,
      stderr=self._log,
      text=True,
      start_new_session=True,  # its own process group, Ray's processes included
      preexec_fn=_die_with_parent,
    )
    if self._process.stdout.readline().strip() != 'ready':
      self._failed()

  def _signal(self, number: int) -> None:
    with contextlib.suppress(ProcessLookupError):
      os.killpg(self._process.pid, number)

  def block(self) -> float:
    self._process.stdin.write(f'{self._rounds}\n')
    self._process.stdin.flush()
    line = self._process.stdout.readline()
    if not line:
      self._failed()
    return float(line)

  def _failed(self) -> None:
    self._signal(signal.SIGKILL)
    code = self._process.wait()
    self._log.seek(0)
    raise RuntimeError(f'{self.kind.label} failed (exit {code}): {self._log.read()[-2000:]}')

  def close(self) -> None:
    self._process.stdin.close()  # the peer's loop ends at stdin's end
    try:
      self._process.wait(timeout=60)
    except subprocess.TimeoutExpired:
      self._signal(signal.SIGKILL)
      self._process.wait()
    self._log.close()


class Peers(contextlib.AbstractContextManager):
  """The peers whose `--<name>_python` is set, started one after another (each warms up
  alone); `block()` runs a block of each in turn: {label: s/round}."""

  def __init__(self, rounds: int, **shape: float):
    self._rounds, self._shape, self._running = rounds, shape, []

  def __enter__(self) -> 'Peers':
    for kind in KINDS:
      if PYTHONS[kind.name].value:
        self._running.append(Peer(kind, PYTHONS[kind.name].value, self._rounds, self._shape))
    return self

  def block(self) -> dict[str, float]:
    return {peer.kind.label: peer.block() for peer in self._running}

  def __exit__(self, *exc) -> None:
    for peer in self._running:
      peer.close()


def check(inputs: dict[str, np.ndarray]) -> dict[str, dict[str, np.ndarray]]:
  """{label: {'kernel', 'bias'}}: each set peer's weights after FedAvg on `inputs`
  (`protocol.read_check`'s arrays), run as its own process (`--check`)."""
  results = {}
  with tempfile.TemporaryDirectory() as folder:
    given = os.path.join(folder, 'in.npz')
    np.savez(given, **inputs)
    for kind in KINDS:
      python = PYTHONS[kind.name].value
      if not python:
        continue
      out = os.path.join(folder, f'{kind.name}.npz')
      done = subprocess.run(
        _command(kind, python, f'--check={given},{out}'),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
      )
      if done.returncode:
        raise RuntimeError(f'{kind.label} --check failed: {done.stderr[-2000:]}')
      with np.load(out) as weights:
        results[kind.label] = {name: weights[name] for name in weights.files}
  return results


# Part 1's targets, (a) / peer and (e) / peer: FedJAX's from the project's first
# measurements; pfl-research's and Flower's from issue #74 (at most half a peer's round).
TARGETS = {'FedJAX': (0.25, 0.3), 'pfl-research': (0.5, 0.5), 'Flower': (0.5, 0.5)}


def report(a: float, e: float | None, peers_a: dict[str, float], peers_e: list) -> None:
  """Part 1's peer lines: each peer's s/round and ours over it."""
  if not peers_a:
    print(
      '  Peers: not timed (no --fedjax_python, --pfl_python, --flower_python;'
      ' `make bench-peers` runs them)'
    )
    return
  for label, seconds in peers_a.items():
    target_a, target_e = TARGETS[label]
    line = f"  {label} fedavg (same run), blocks between (a)'s: median {seconds:.5f} s/round;"
    line += f' a / {label} = {a / seconds:.3f} (target <= {target_a})'
    if e is not None:
      around = [block[label] for block in peers_e]
      line += (
        f'; just before and after (e): {around[0]:.5f}, {around[1]:.5f};'
        f' e / {label} = {e / float(np.mean(around)):.3f} (target <= {target_e})'
      )
    print(line)


def report_weights(task, clients: int, lr: float, rounds: int = 2, batch: int = 16) -> None:
  """Part 1's check: tff_comp's FedAvg (in-process, lanes, no shuffling) and each peer's
  on the same `rounds` rounds of lasso I from zero weights, at a batch that divides
  the 128 examples (FedJAX's epoch fills its last batch from the epoch's start: at
  batch 10 it trains 130 examples, not 128). Prints the largest kernel difference
  over the largest kernel entry."""
  if not any(python.value for python in PYTHONS.values()):
    return
  arrays = task.client_arrays()
  ids = list(arrays.client_ids)
  x, y = arrays.examples
  picks = np.array(timing.selections(len(ids), clients, rounds))
  process = fedavg.build_fedavg(
    task.model, client_learning_rate=lr, batch_size=batch, shuffle=False
  )
  runner = inprocess.build(process, task.train_data, engine='lanes')
  state = runner.initialize()
  for chosen in picks:
    state = runner.next(state, [ids[i] for i in chosen]).state
  kernel, bias = (np.asarray(w) for w in runner.get_model_weights(state).trainable)
  (start_kernel, start_bias), _ = task.model.initial_weights
  theirs = check(
    dict(
      x=x.reshape(len(ids), -1, x.shape[-1]),
      y=y.reshape(len(ids), -1),
      kernel=np.asarray(start_kernel).reshape(-1),
      bias=np.asarray(start_bias),
      picks=picks,
      learning_rate=np.float32(lr),
      batch_size=np.int32(batch),
    )
  )
  scale = float(np.abs(kernel).max())
  print(
    f'  Weights after {rounds} rounds (batch {batch}, no shuffling), largest difference from'
    f" tff_comp's kernel over its largest entry (|w| = {scale:.4f}); bias difference: "
    + '; '.join(
      f'{label} {np.abs(w["kernel"] - kernel.reshape(-1)).max() / scale:.1e},'
      f' {abs(float(w["bias"]) - float(bias)):.1e}'
      for label, w in theirs.items()
    )
  )
