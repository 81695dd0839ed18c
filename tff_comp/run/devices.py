"""Simulated device time: each client's speed and network time, a round's simulated
duration, deadlines and over-selection (synchronous rounds).

A client's round takes  t_i = work_i / speed_i + network_i  simulated seconds, where
work_i is the examples its local work visits (`ClientWork`: local_epochs x n_i, or
local_steps x the step's batch) and (speed_i, network_i) are drawn once per client from
the run's seed (lognormal around --device_speed and --network_seconds) or read from a
CSV trace. A round ends when its last kept client reports:

    no deadline, no over-selection:  max over reporting clients of t_i
    --overselect=s (k = --clients_per_round):  ceil(s k) sampled, the first k to finish
        kept (the rest discarded), the round ending at the k-th arrival
    --round_deadline=D:  clients with t_i > D are dropped (their work discarded,
        counted as participation/late), or with --deadline_policy=partial do the share of
        their local steps that fits, (D - network_i) speed_i / work_i (FedNova's
        setting; in-process runtime); the round ends at D if a client was cut, else at
        its last arrival

as in production systems (Bonawitz et al. 2019). A trace's availability windows
restrict which clients a round may sample: a client is available in round r when the
simulated clock at the round's start lies in one of its windows. Everything is a
function of the seed and the round (the clock is replayed from round 1), so a resumed
run draws the same clients at the same times.
"""

from collections.abc import Callable, Sequence
import csv
import dataclasses
import functools
import math
import pathlib
from typing import NamedTuple
import zlib

import numpy as np
import tensorflow as tf

from tff_comp import settings
from tff_comp.ops import client_round
from tff_comp.runtime.inprocess import streaming
from tff_comp.settings import ConfigError

DEVICE_MODELS = ('none', 'lognormal', 'trace')
DEADLINE_POLICIES = ('drop', 'partial')
# A draw stream of its own: device draws never shift the sampler's (seeded by the round).
_STREAM = 0xDE71CE


_LOGNORMAL = {'device_model': ('lognormal',)}  # the lognormal model's parameters


@dataclasses.dataclass(frozen=True)
class DeviceOptions:
  """The device model and the round's deadline (module docstring)."""

  device_model: str = settings.setting(
    'none',
    "Simulated device time: none; lognormal (each client's speed and network"
    ' time drawn once from --seed around --device_speed and --network_seconds); or'
    ' trace (--device_trace). Adds time/round_seconds and time/simulated_seconds.',
    choices=DEVICE_MODELS,
  )
  device_speed: float = settings.setting(
    100.0,
    'Median examples a simulated device trains a second.',
    above=0.0,
    applies_when=_LOGNORMAL,
  )
  device_speed_sigma: float = settings.setting(
    0.5,
    "Spread of the devices' speeds: the standard deviation of their log.",
    lower=0.0,
    applies_when=_LOGNORMAL,
  )
  network_seconds: float = settings.setting(
    1.0,
    'Median simulated seconds a client spends on the network a round (model down, update up).',
    lower=0.0,
    applies_when=_LOGNORMAL,
  )
  network_sigma: float = settings.setting(
    0.5,
    'Spread of the network times: the standard deviation of their log.',
    lower=0.0,
    applies_when=_LOGNORMAL,
  )
  device_trace: str | None = settings.setting(
    None,
    'CSV of client_id,speed,network_seconds[,windows] (windows: start-end'
    ' simulated seconds, several joined by ;) for --device_model=trace.',
    input_file=True,
  )
  round_deadline: float | None = settings.setting(
    None,
    'Simulated seconds a round waits; later clients are dropped (or cut: see --deadline_policy).',
    above=0.0,
  )
  deadline_policy: str = settings.setting(
    'drop',
    'A client the deadline would miss: drop (its work discarded) or partial'
    ' (it does the local steps that fit; in-process runtime).',
    choices=DEADLINE_POLICIES,
    applies_when={'round_deadline': settings.GIVEN},
  )
  overselect: float = settings.setting(
    1.0,
    'Sample this many times --clients_per_round and keep the first to finish.',
    lower=1.0,
    upper=100.0,
  )

  def __post_init__(self):
    settings.check(self)
    modelled = self.device_model != 'none'
    if (self.device_model == 'trace') != (self.device_trace is not None):
      raise ValueError('--device_trace goes with --device_model=trace (and it needs one).')
    if not modelled and (self.round_deadline is not None or self.overselect > 1.0):
      raise ValueError(
        '--round_deadline and --overselect need a device model (--device_model=lognormal or trace).'
      )

  @property
  def enabled(self) -> bool:
    return self.device_model != 'none'


class Device(NamedTuple):
  """One client's device: examples a second, network seconds a round, and the windows
  of simulated time it is available in (None: always)."""

  speed: float
  network: float
  windows: tuple[tuple[float, float], ...] | None = None

  def available(self, clock: float) -> bool:
    return self.windows is None or any(a <= clock < b for a, b in self.windows)


def draw_devices(client_ids: Sequence[str], options: DeviceOptions, seed: int) -> dict[str, Device]:
  """Each client's device: drawn from `seed` and its id (lognormal; the same in every
  run with `seed`, whatever the population) or read from the trace.

  Raises:
    ValueError: a trace that cannot be read, or misses a client (message names it).
  """
  if options.device_trace is not None:  # --device_model=trace (the record checks)
    return read_trace(pathlib.Path(options.device_trace), client_ids)
  drawn = _Drawn(options, seed)
  return {client: drawn[client] for client in client_ids}


class _Drawn(dict):
  """Lognormal devices drawn on first use, each from its own stream (seed, client id):
  a run draws only the clients it samples (342,477 draws took seconds at start)."""

  def __init__(self, options: DeviceOptions, seed: int):
    super().__init__()
    self._options, self._seed = options, seed

  def __missing__(self, client: str) -> Device:
    o = self._options
    z = np.random.default_rng([self._seed, _STREAM, zlib.crc32(client.encode())]).standard_normal(2)
    device = self[client] = Device(
      float(o.device_speed * np.exp(o.device_speed_sigma * z[0])),
      float(o.network_seconds * np.exp(o.network_sigma * z[1])),
    )
    return device


def read_trace(path: pathlib.Path, client_ids: Sequence[str]) -> dict[str, Device]:
  """The devices of a CSV trace: a header naming client_id, speed and network_seconds,
  and optionally windows ('0-3600;7200-10800': simulated seconds, start inclusive).

  Raises:
    ValueError: the file is missing or malformed, lists a client twice, or lacks a
      client of `client_ids`.
  """
  where = f'--device_trace={path}'
  try:
    with path.open(newline='') as f:
      rows = list(csv.DictReader(f))
  except OSError as e:
    raise ValueError(f'{where}: {e.strerror or e}.') from e
  devices = {}
  for line, row in enumerate(rows, start=2):
    try:
      windows = row.get('windows') or None
      if windows is not None:
        windows = tuple(tuple(float(x) for x in w.split('-', 1)) for w in windows.split(';'))
        if any(len(w) != 2 or not w[0] < w[1] for w in windows):
          raise ValueError('a window is start-end with start < end')
      device = Device(float(row['speed']), float(row['network_seconds']), windows)
    except (KeyError, TypeError, ValueError) as e:
      raise ValueError(
        f'{where}, line {line}: needs client_id, speed > 0 and network_seconds >= 0 ({e}).'
      ) from e
    if not (
      device.speed > 0
      and device.network >= 0
      and math.isfinite(device.speed)
      and math.isfinite(device.network)
    ):
      raise ValueError(f'{where}, line {line}: needs speed > 0 and network_seconds >= 0.')
    if row['client_id'] in devices:
      raise ValueError(f'{where}, line {line}: client {row["client_id"]!r} has a row already.')
    devices[row['client_id']] = device
  missing = [c for c in client_ids if c not in devices]
  if missing:
    raise ValueError(f'{where} has no row for {len(missing)} of the clients, e.g. {missing[0]!r}.')
  return devices


class ClientWork:
  """Examples a client's local work visits in a round: `local_steps` x `step_batch`
  (every client alike) or `local_epochs` x its examples (`counts`, by client id). With
  drawn epochs (--local_epochs_max) the device model times the lower bound."""

  def __init__(
    self,
    counts: Callable[[str], int],
    *,
    step_batch: int,
    local_epochs: int = 1,
    local_steps: int | None = None,
  ):
    self._counts, self._batch = counts, step_batch
    self._epochs, self._steps = local_epochs, local_steps

  def __call__(self, client_id: str) -> float:
    if self._steps is not None:
      return float(self._steps * self._batch)
    return float(self._epochs * self._counts(client_id))


class Timing(NamedTuple):
  """A round's timing: the clients kept (in sampled order), each one's share of its
  local steps (None: all), how many the deadline or over-selection turned away, and the
  round's simulated seconds."""

  kept: tuple[str, ...]
  work: tuple[float, ...] | None
  late: int
  seconds: float


class DeviceClock:
  """Times rounds on the clients' devices (module docstring)."""

  def __init__(
    self, devices: dict[str, Device], work: Callable[[str], float], options: DeviceOptions
  ):
    self.devices, self._work, self.options = devices, work, options
    # Without windows every client is always available: no per-round pass over them.
    self._windows = options.device_model == 'trace' and any(
      d.windows is not None for d in devices.values()
    )

  def seconds(self, client_id: str) -> float:
    """t_i: the client's compute and network time for its whole round."""
    device = self.devices[client_id]
    return self._work(client_id) / device.speed + device.network

  def available(self, client_ids: Sequence[str], clock: float) -> Sequence[str]:
    if not self._windows:
      return client_ids
    return [c for c in client_ids if self.devices[c].available(clock)]

  def next_window(self, clock: float) -> float:
    """The first time after `clock` a client's window opens.

    Raises:
      ConfigError: no window opens after `clock` (the trace has ended), a one-line
        error for the run.
    """
    starts = [a for d in self.devices.values() for a, _ in d.windows or () if a > clock]
    if not starts:
      raise ConfigError(
        f'--device_trace: no client is available after simulated second'
        f" {clock:g}; the trace's windows have ended."
      )
    return min(starts)

  def time_round(self, reporting: Sequence[str], keep: int | None) -> Timing:
    """The round of the `reporting` clients (in sampled order): over-selection keeps
    the first `keep` to finish (None: all), then the deadline applies."""
    times = {i: self.seconds(c) for i, c in enumerate(reporting)}
    order = sorted(times, key=lambda i: (times[i], i))  # finish order, ties by position
    chosen = set(order[:keep] if keep is not None else order)
    late = len(reporting) - len(chosen)
    deadline, partial = self.options.round_deadline, self.options.deadline_policy == 'partial'
    kept, work, cut = [], [], False
    for i, client in enumerate(reporting):
      if i not in chosen:
        continue
      if deadline is None or times[i] <= deadline:
        kept.append(client)
        work.append(1.0)
        continue
      cut = True
      device = self.devices[client]
      fits = (deadline - device.network) * device.speed / max(self._work(client), 1e-12)
      if partial and fits > 0:
        kept.append(client)
        work.append(min(fits, 1.0))
      else:
        late += 1
    arrivals = [min(times[i], deadline) if deadline is not None else times[i] for i in chosen]
    seconds = deadline if cut and deadline is not None else max(arrivals, default=0.0)
    return Timing(
      tuple(kept), tuple(work) if any(w < 1 for w in work) else None, late, float(seconds)
    )


def clock_for(options: DeviceOptions, client_data, algorithm, seed: int) -> DeviceClock | None:
  """The run's clock (None without a device model): devices drawn from `seed` or read
  from the trace; a client's work from `algorithm`'s (`ops.algorithm.Algorithm`) local
  work and its examples in `client_data`, counted when it is first sampled.

  Raises:
    ConfigError: a device model for a program that is not an `Algorithm` (its local
      work is unknown), or a trace that cannot be used.
  """
  if not options.enabled:
    return None
  if algorithm is None:
    raise ConfigError(
      "--device_model times a registered algorithm's local work; this program's is unknown."
    )
  local = algorithm.client_options
  counts = functools.cache(lambda c: len(tf.nest.flatten(streaming.read_client(client_data, c))[0]))
  work = ClientWork(
    counts,
    step_batch=client_round.step_batch_size(algorithm.client_rule, local),
    local_epochs=local.local_epochs,
    local_steps=local.local_steps,
  )
  try:
    devices = (
      _Drawn(options, seed)
      if options.device_model == 'lognormal'
      else draw_devices(list(client_data.client_ids), options, seed)
    )
  except ValueError as e:
    raise ConfigError(str(e)) from e
  return DeviceClock(devices, work, options)


def check_run(options: DeviceOptions, straggler_rate: float, runtime) -> None:
  """Raises ConfigError where the run's device model and its runtime or its stragglers
  disagree: stragglers come from --straggler_rate or the device model, not both; a
  partial deadline needs a runtime running part of a client's steps."""
  if options.enabled and straggler_rate > 0:
    raise ConfigError(
      '--straggler_rate with --device_model: a device model makes its own'
      ' stragglers (--round_deadline with --deadline_policy=partial); give'
      ' one.'
    )
  partial = straggler_rate > 0 or (
    options.round_deadline is not None and options.deadline_policy == 'partial'
  )
  if partial and not runtime.partial_work:
    flag = '--straggler_rate' if straggler_rate > 0 else '--deadline_policy=partial'
    raise ConfigError(
      f'{flag}: the {runtime.name} runtime cannot run clients doing part of'
      ' their local steps; use --runtime=inprocess.'
    )
