"""Joining a Ray cluster and running tasks on it: what the Ray runtime
(`runtime.ray`) and Ray grids (`reproduce.py --ray_address`) share. Ray is an optional
dependency (`pip install tff_comp[ray]`), imported when a run asks for it."""

import atexit
from collections.abc import Callable, Sequence
import dataclasses
import logging as py_logging
import math
import os
import re
import signal
import socket
import threading
from typing import Any

from tff_comp import native_logs, settings
from tff_comp.runtime import base

LOCAL = 'local'  # --ray_address: a Ray cluster of this machine, started by the run
# Times an actor's part of a round, or a task lost with its worker, runs again.
RETRIES = 3
# Seconds the processes of a local cluster (`LOCAL`) wait for its GCS to come back.
_LOCAL_GCS_RECONNECT_S = 5
# The driver's one error about Ray's metrics agent, which Ray's core package does not
# start: logged about 30 s after joining (`native_logs.drop_line`), kept out for up to
# this many seconds.
_NO_METRICS_AGENT = re.compile(r'Failed to establish connection to the metrics exporter agent')
_NO_METRICS_AGENT_WITHIN_S = 120


@dataclasses.dataclass(frozen=True)
class RayOptions:
  """Where and how a run's clients run on Ray (`--ray_address` set: this runtime)."""

  ray_address: str = settings.setting(
    '',
    "Run each round's clients on Ray actors: 'local' (a Ray cluster of this"
    " machine, started by the run), 'auto' (the cluster this machine joined with `ray"
    " start`), or a cluster's address (host:port). Default: no Ray.",
  )
  ray_actors: int = settings.setting(
    2,
    'Ray actors, each holding a share of the clients (one per GPU where hosts have several).',
    lower=1,
    upper=settings.MAX_COUNT,
  )
  ray_gpus_per_actor: float = settings.setting(
    0.0, "GPUs each Ray actor takes (Ray's num_gpus; 1 for one actor per GPU).", lower=0.0
  )

  def __post_init__(self):
    settings.check(self)


def ray_module():
  """The `ray` module, imported when a run uses it.

  Raises:
    base.UnsupportedError: Ray is not installed.
  """
  try:
    import ray
  except ImportError as e:
    raise base.UnsupportedError(
      "Ray is not installed: pip install 'tff_comp[ray]' (BUILD_NOTES.md)"
    ) from e
  return ray


def connect(address: str) -> Any:
  """This process joined to the Ray cluster at `address` (`RayOptions.ray_address`),
  started here for 'local'; returns the `ray` module. Joined once per process.

  Raises:
    base.UnsupportedError: Ray is missing, or the cluster cannot be reached.
  """
  ray = ray_module()
  if ray.is_initialized():
    return ray
  # No metrics collected (Ray's core package starts no agent to export them to; the
  # driver's error saying so is kept out: `_NO_METRICS_AGENT`), and Ray's own setting of
  # the accelerator variables kept as it is (it warns otherwise).
  os.environ.setdefault('RAY_enable_metrics_collection', '0')
  os.environ.setdefault('RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO', '0')
  if address == LOCAL:
    # A cluster this run starts dies with it: its GCS and raylet at once (Ray's fate
    # sharing); its dashboard and runtime_env agents first report the raylet's death to
    # the dead GCS, waiting out this reconnect timeout (Ray's default 60 s: they lived on
    # for a minute after a killed driver). No reconnect is awaited on a machine's own
    # cluster: its GCS gone is its end.
    os.environ.setdefault('RAY_gcs_rpc_server_reconnect_timeout_s', str(_LOCAL_GCS_RECONNECT_S))
  quiet = dict(include_dashboard=False, log_to_driver=False, logging_level=py_logging.ERROR)
  if address not in (LOCAL, 'auto'):
    _check_reachable(address)
  # ray.init replaces SIGTERM's handler with its own (sys.exit): the run's
  # (`tff_comp.signals`: stop at the round's end, saved, exit 143) is put back.
  handlers = (
    {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    if threading.current_thread() is threading.main_thread()
    else {}
  )
  native_logs.drop_line(_NO_METRICS_AGENT, _NO_METRICS_AGENT_WITHIN_S)
  try:
    if address == LOCAL:
      ray.init(num_cpus=os.cpu_count(), **quiet)
    else:
      ray.init(address=address, **quiet)
  except (ConnectionError, RuntimeError, ValueError, TimeoutError) as e:
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    raise base.UnsupportedError(
      f'the Ray cluster at --ray_address={address} cannot be reached ({first})'
    ) from e
  finally:
    for sig, handler in handlers.items():
      if handler is not None:
        signal.signal(sig, handler)
  # Ray's own shutdown at exit (an atexit hook) runs only after the interpreter has
  # waited for its threads, which wait on Ray: a script ending without `ray.shutdown()`
  # took 2.5 min to exit, 1.2 s with it. Registered where concurrent.futures registers
  # its own, before that wait (threading has no public hook for it).
  register = getattr(threading, '_register_atexit', atexit.register)
  register(ray.shutdown)
  return ray


def check_gpus(ray, address: str, actors: int, per_actor: float) -> None:
  """Raises UnsupportedError unless the cluster's nodes can place `actors` actors of
  `per_actor` GPUs each: Ray waits, silently and forever, for resources no node has.
  Nodes an autoscaler has not started yet are not counted."""
  if not per_actor:
    return
  nodes = [n.get('Resources', {}).get('GPU', 0.0) for n in ray.nodes() if n.get('Alive')]
  # Equal actors pack node by node: floor(node's GPUs / per actor) each (1e-9: Ray's
  # fractional GPUs are float sums).
  places = sum(math.floor(gpus / per_actor + 1e-9) for gpus in nodes)
  if places < actors:
    raise base.UnsupportedError(
      f'--ray_gpus_per_actor={per_actor:g} x --ray_actors={actors}: the Ray cluster at'
      f' --ray_address={address} can place {places} such actor(s) (GPUs by node:'
      f' {", ".join(f"{g:g}" for g in nodes) or "none"}); Ray would wait for them forever'
    )


def _check_reachable(address: str, timeout: float = 5.0) -> None:
  """Raises UnsupportedError unless `address` (host:port, or ray://host:port) accepts a
  connection within `timeout` seconds: Ray's own client waits minutes for a cluster
  that is not there."""
  host, _, port = address.removeprefix('ray://').rpartition(':')
  try:
    with socket.create_connection((host, int(port)), timeout=timeout):
      pass
  except (OSError, ValueError) as e:
    raise base.UnsupportedError(
      f'the Ray cluster at --ray_address={address} cannot be reached'
      f' ({type(e).__name__}: {e or "no answer"}); give host:port of a running'
      " cluster's head (`ray start --head`), 'auto' or 'local'"
    ) from e


def run_tasks(
  fn: Callable[..., Any],
  calls: Sequence[tuple],
  *,
  again: Callable[[tuple], tuple] = lambda args: args,
  label: Callable[[tuple], str] = str,
  done: Callable[[int, Any], None] = lambda i, result: None,
) -> list[Any]:
  """[fn(*args) for args in calls] as Ray tasks of one CPU each on the cluster this
  process joined (`connect`), run together; `done(i, result)` as each finishes (the
  driver's progress). A task lost with its worker (the worker process died) runs again
  as fn(*again(args)) (up to `RETRIES` times), said in one line naming `label(args)`; a
  task's own error is raised as itself."""
  ray = ray_module()
  remote = ray.remote(num_cpus=1, max_retries=0)(fn)
  refs = [remote.remote(*args) for args in calls]
  results, attempts = [None] * len(calls), [0] * len(calls)
  pending = dict(enumerate(refs))
  while pending:
    (ready,), _ = ray.wait(list(pending.values()), num_returns=1)
    i = next(i for i, ref in pending.items() if ref == ready)
    try:
      results[i] = ray.get(ready)
      del pending[i]
      done(i, results[i])
    except (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError):
      attempts[i] += 1
      if attempts[i] > RETRIES:
        raise
      print(
        f'ray: the task of {label(calls[i])} was lost with its worker; it runs again.', flush=True
      )
      pending[i] = remote.remote(*again(calls[i]))
    except ray.exceptions.RayTaskError as e:
      raise e.as_instanceof_cause() from None
  return results
