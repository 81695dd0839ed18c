"""A local TFF execution context whose C++ worker dies with Python.

`import tensorflow_federated` installs a context that starts the bundled
`worker_binary` on first use, with the parent's stdout/stderr, and relies on
`__del__` to stop it. At interpreter exit `__del__` often never runs, so the worker
outlives Python and holds the parent's pipes open: shell pipelines and CI steps that
read them hang. TFF offers no switch for this, so this module replaces the default
context with the same executor stack (remote executor over gRPC to a local worker)
but starts the worker itself:

* on Linux the worker gets `PR_SET_PDEATHSIG = SIGKILL`, so the kernel kills it when
  the Python process ends for any reason (exit, exception, SIGTERM, even SIGKILL): set
  by util-linux's `setpriv --pdeathsig`, which then executes the worker, so that no
  Python runs in the forked child (a `preexec_fn` in a process with threads can abort
  there); by `prctl` in a `preexec_fn` where `setpriv` is missing;
* an `atexit` hook also stops it on a normal exit (and on platforms without prctl);
* its output goes to a log file (or /dev/null), never to the parent's pipes.

`import tff_comp` makes it TFF's default context as soon as TFF is imported (before or
after tff_comp: `adopt_default_context`), in place of the context TFF's import installs,
so a researcher's own script (`build_fedavg(...)`, `initialize()`, `next()`) gets it
too; a context anyone else set (a test context, remote workers, a researcher's own)
stays. It starts no worker until a computation first runs.
"""

import atexit
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

from absl import logging
import grpc
import portpicker
import tensorflow_federated as tff

from tff_comp import signals

WORKER_BINARY = os.path.join(os.path.dirname(tff.__file__), 'data', 'worker_binary')
_LOG_ENV = 'TFF_COMP_WORKER_LOG'
_SETPRIV = shutil.which('setpriv') if sys.platform.startswith('linux') else None
_MAX_MESSAGE_BYTES = 2 * 1000 * 1000 * 1000
CHANNEL_OPTIONS = [
  ('grpc.max_message_length', _MAX_MESSAGE_BYTES),
  ('grpc.max_receive_message_length', _MAX_MESSAGE_BYTES),
  ('grpc.max_send_message_length', _MAX_MESSAGE_BYTES),
]
_READY_TIMEOUT_S = 60.0


def grpc_stub(address: str) -> tff.framework.RemoteExecutorGrpcStub:
  """A stub talking gRPC to the TFF worker at `address` (host:port)."""
  return tff.framework.RemoteExecutorGrpcStub(grpc.insecure_channel(address, CHANNEL_OPTIONS))


def execution_context(stub_fn, context_class):
  """A TFF execution context of `context_class` (Sync or Async) running computations
  on the worker `stub_fn()` returns (called for every executor the context makes)."""

  def stack_fn(cardinalities):
    cardinalities.setdefault(tff.CLIENTS, 0)
    executor = tff.framework.RemoteExecutor(stub_fn())
    executor.set_cardinalities(cardinalities)
    return executor

  return context_class(
    executor_fn=tff.framework.ResourceManagingExecutorFactory(stack_fn),
    compiler_fn=tff.backends.native.desugar_and_transform_to_native,
    transform_args=tff.tensorflow.transform_args,
    transform_result=tff.tensorflow.transform_result,
  )


def _die_with_parent() -> None:
  """Runs in the child between fork and exec: SIGKILL it when the parent dies."""
  signals.on_parent_death(signal.SIGKILL)


def spawn_worker(port: int, max_concurrent_computation_calls: int = -1) -> subprocess.Popen:
  """Starts `worker_binary --port=port`, killed when this Python process ends, its
  output to `$TFF_COMP_WORKER_LOG` or nowhere (never this process's pipes)."""
  log_path = os.environ.get(_LOG_ENV)
  out = open(log_path, 'ab') if log_path else subprocess.DEVNULL
  command = [
    WORKER_BINARY,
    f'--port={port}',
    f'--max_concurrent_computation_calls={max_concurrent_computation_calls}',
  ]
  try:
    return subprocess.Popen(
      [_SETPRIV, '--pdeathsig', 'KILL', '--', *command] if _SETPRIV else command,
      stdin=subprocess.DEVNULL,
      stdout=out,
      stderr=out,
      preexec_fn=None if _SETPRIV else _die_with_parent,
    )
  finally:
    if not isinstance(out, int):  # the log file (DEVNULL is a constant)
      out.close()


class _Worker:
  """One lazily started local worker process and the gRPC stub that talks to it."""

  def __init__(self, max_concurrent_computation_calls: int):
    self._max_calls = max_concurrent_computation_calls
    self._lock = threading.Lock()
    self._process: subprocess.Popen | None = None
    self._stub = None

  @property
  def pid(self) -> int | None:
    process = self._process
    return process.pid if process is not None and process.poll() is None else None

  def stub(self):
    with self._lock:
      if self._stub is not None and self._stub.is_ready:
        return self._stub
      self.stop()
      port = portpicker.pick_unused_port()
      self._process = spawn_worker(port, self._max_calls)
      self._stub = grpc_stub(f'localhost:{port}')
      deadline = time.monotonic() + _READY_TIMEOUT_S
      while not self._stub.is_ready:
        if self._process.poll() is not None or time.monotonic() > deadline:
          code = self._process.poll()
          self.stop()
          raise RuntimeError(
            f'TFF worker {WORKER_BINARY} did not start (exit code {code});'
            f' set {_LOG_ENV}=<file> to capture its output.'
          )
        time.sleep(0.05)
      logging.debug('TFF worker pid %d on port %d', self._process.pid, port)
      return self._stub

  def stop(self) -> None:
    if self._process is not None and self._process.poll() is None:
      self._process.kill()
      self._process.wait()
    self._process = None
    self._stub = None


_worker: _Worker | None = None


def install_local_runtime(max_concurrent_computation_calls: int = -1) -> None:
  """Makes a local C++ runtime with a parent-bound worker TFF's default context.

  Args:
    max_concurrent_computation_calls: forwarded to the worker; nonpositive means no
      limit.
  """
  global _worker
  shutdown_local_runtime()
  worker = _Worker(max_concurrent_computation_calls)
  tff.framework.set_default_context(
    execution_context(worker.stub, tff.framework.SyncExecutionContext)
  )
  _worker = worker


def _is_tffs_import_context(context) -> bool:
  """Whether `context` is the one `import tensorflow_federated` installs
  (`set_sync_local_cpp_execution_context`): executors from `local_cpp_executor_factory`,
  whose worker writes to our pipes and outlives us, behind TFF's native compiler (TFF's
  test contexts share the factory, not the compiler). Read from TFF 0.87's private
  attributes, as TFF names no such context publicly; `tests/test_worker_lifetime.py`
  checks the reading against TFF's own contexts."""
  factory = getattr(context, '_executor_factory', None)
  stack_fn = getattr(factory, '_executor_stack_fn', None)
  pipeline = getattr(getattr(context, '_async_context', None), '_compiler_pipeline', None)
  return (
    getattr(stack_fn, '__qualname__', '').startswith('local_cpp_executor_factory.')
    and getattr(pipeline, '_compiler_fn', None)
    is tff.backends.native.desugar_and_transform_to_native
  )


def adopt_default_context() -> None:
  """Installs the local runtime in place of TFF's import-time context, whose worker
  outlives Python; any other default context (set by a researcher, a test, `workers`)
  stays. Called by `import tff_comp` once TFF is imported."""
  if _worker is None and _is_tffs_import_context(tff.framework.get_context_stack().current):
    install_local_runtime()


def ensure_local_runtime() -> None:
  """Installs the local runtime unless this process already has it installed."""
  if _worker is None:
    install_local_runtime()


def shutdown_local_runtime() -> None:
  """Stops the worker started by `install_local_runtime`, if any."""
  if _worker is not None:
    _worker.stop()


def worker_pids() -> list[int]:
  """Pids of live workers started by this process (at most one)."""
  pid = _worker.pid if _worker is not None else None
  return [pid] if pid is not None else []


def _at_exit() -> None:
  """Stops this process's worker, and releases TFF's default context while the
  interpreter is whole: the context `import tensorflow_federated` installs (still there
  in a process that ran nothing through TFF: a grid's or a Ray task's) has an executor
  factory whose `ServiceManager.__del__` reads the `subprocess` module, and run at
  teardown, after that module was cleared, it printed an "Exception ignored" traceback
  at every such process's exit. Released now, it stops its service as it would have."""
  shutdown_local_runtime()
  # not in TFF's public API
  from tensorflow_federated.python.core.impl.context_stack import set_default_context

  set_default_context.set_no_default_context()


atexit.register(_at_exit)
