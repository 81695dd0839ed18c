"""Where a grid's units run (`grid.run_grid`): in this process, in `--parallel` processes
of their own, each on its share of the cores and stopped by a signal to the grid, or as
tasks on a Ray cluster (`--ray_address`)."""

import concurrent.futures
import contextlib
import io
import multiprocessing
import os
import signal
import sys
import threading
import time
from typing import Any

import tensorflow as tf
import threadpoolctl

from tff_comp import experiment as experiment_lib
from tff_comp import signals
from tff_comp import trials as trials_lib
from tff_comp.binaries import closed_stdout, reproductions
from tff_comp.runtime import base as runtime_base
from tff_comp.runtime.inprocess import resident_data
from tff_comp.runtime.ray import cluster as ray_cluster

# A grid's process holds TensorFlow, its task's data and a batched group's trials: 1.1
# GB resident for fco_lasso's 48 trials of lasso (d = 1024); a default leaves room for
# grids that declare no peak of their own (`Reproduction.process_gb`).
PROCESS_GB = 1.5


def _available_bytes() -> float | None:
  """The memory the kernel says is available for new work (MemAvailable), if it says."""
  try:
    with open('/proc/meminfo', encoding='ascii') as f:
      for line in f:
        if line.startswith('MemAvailable:'):
          return float(line.split()[1]) * 1024
  except OSError:
    pass
  return None


def default_processes(
  spec: reproductions.Reproduction, seeds: int, batch_trials: bool
) -> tuple[int, str]:
  """The processes `spec`'s grid runs in by default (`reproduce.py --parallel`), and why,
  in words: one a core this process may use, no more than its units (each algorithm's
  batched trials, or each (algorithm, seed) of `seeds`), and no more than the available
  memory holds at `spec.process_gb` each (default `PROCESS_GB`)."""
  units = len(spec.algorithms) * (1 if batch_trials else seeds)
  process_gb = spec.process_gb or PROCESS_GB
  cores = len(os.sched_getaffinity(0))
  processes = max(1, min(cores, units))
  why = f'one a core ({cores}), at most one a unit'
  available = _available_bytes()
  if available is not None and available // (process_gb * 2**30) < processes:
    processes = max(1, int(available // (process_gb * 2**30)))
    why += f', as many as {available / 2**30:.1f} GB available hold at {process_gb:g} GB each'
  return processes, f'{units} unit(s) on {processes} process(es): {why}'


def run_units(
  run, args: list[tuple], labels: list[str], options: dict, parallel: int, ray_address, progress
) -> list[Any]:
  """`run(*a)` for each of `args` (the units named `labels`), on the Ray cluster at
  `ray_address`, else in `parallel` processes, else here; `progress.done(i)` as unit i
  ends."""
  if ray_address:
    results = _on_cluster(run, args, labels, options, ray_address, progress)
  elif parallel > 1:
    # Fresh interpreters (spawn): TensorFlow's runtime does not survive a fork.
    with concurrent.futures.ProcessPoolExecutor(
      parallel,
      mp_context=multiprocessing.get_context('spawn'),
      initializer=_grid_process,
      initargs=(max(1, resident_data.kernel_threads('CPU') // parallel), os.getpid()),
    ) as pool:
      futures = [pool.submit(_unless_stopped, run, *a) for a in args]
      for i, future in enumerate(futures):
        future.add_done_callback(lambda _, i=i: progress.done(i))
      _forward_signals(futures)
      results = [future.result() for future in futures]
  else:
    with threadpoolctl.threadpool_limits(limits=1, user_api='blas'):
      results = []
      for i, a in enumerate(args):
        results.append(run(*a))
        progress.done(i)
  return results


def _on_cluster(
  run, args: list[tuple], labels: list[str], options: dict, ray_address: str, progress
) -> list[Any]:
  """`run(*a)` for each of `args` as Ray tasks (`ray_cluster.run_tasks`), each unit's
  lines shown as it ends; a unit lost with its worker runs again, resumed."""
  try:
    ray_cluster.connect(ray_address)
  except runtime_base.UnsupportedError as e:
    raise experiment_lib.ConfigError(str(e)) from e
  start, finished = time.monotonic(), []

  def report(i: int, result: tuple[Any, str]) -> None:
    """A unit's own lines, as it printed them on its worker, and the grid's progress."""
    finished.append(i)
    progress.done(i)
    print(
      f'{result[1]}ray: {labels[i]} done ({len(finished)} of {len(labels)} units,'
      f' {time.monotonic() - start:.0f}s)',
      flush=True,
    )

  return [
    result
    for result, _ in ray_cluster.run_tasks(
      _on_ray,
      [(run, label, *a) for label, a in zip(labels, args)],
      again=lambda call: tuple(
        dict(x, resume=True, overwrite=False) if x is options else x for x in call
      ),
      label=lambda call: call[1],
      done=report,
    )
  ]


def _forward_signals(futures: list[concurrent.futures.Future]) -> None:
  """Waits for the grid's processes; a signal to this process (`kill`: SIGTERM reaches
  the parent alone, where Ctrl-C reaches them all) goes to each of them, whose running
  configuration stops at its round's end (`_grid_process` installs the handlers), and the
  units not started are dropped. Raises KeyboardInterrupt(the signal's name) once they
  stopped."""
  forwarded = None
  while not all(future.done() for future in futures):
    concurrent.futures.wait(futures, timeout=0.5)
    name = signals.requested()
    if name and forwarded is None:
      forwarded = name
      for future in futures:
        future.cancel()
      for child in multiprocessing.active_children():
        os.kill(child.pid, getattr(signal, name))
  if forwarded:
    raise KeyboardInterrupt(forwarded) from KeyboardInterrupt(forwarded)


# Held while a grid's process runs a unit, so that an orphaned one exits between units.
_running = threading.Lock()


def _unless_stopped(run, *args) -> Any:
  """`run(*args)` in a grid's process, unless a signal stopped one of its units before
  (the process takes the units queued for it after the stop)."""
  name = signals.received()
  if name:
    raise KeyboardInterrupt(name)
  with _running:
    return run(*args)


def _grid_process(threads: int, parent: int) -> None:
  """A `--parallel` process of the grid: its share of the cores (`_share_cores`), a
  signal stopping its running configuration at its round's end (`tff_comp.signals`), a
  closed stdout no error (`closed_stdout`), and, when its `parent` dies, SIGTERM and an
  exit once its unit stopped (`_exit_when_orphaned`: a killed grid's processes ran on to
  their last round, then waited for units forever, holding the grid's stderr)."""
  signals.install()
  signals.on_parent_death(signal.SIGTERM)
  threading.Thread(target=_exit_when_orphaned, args=(parent,), daemon=True).start()
  _share_cores(threads)
  # Its stdout is the grid's: once that reader has gone (`reproduce.py | head -1`), its
  # lines go nowhere instead of ending its unit in a BrokenPipeError.
  sys.stdout = closed_stdout.PipeSafeStdout(sys.stdout)


def _exit_when_orphaned(parent: int) -> None:
  """Waits for `parent` to die (the kernel gives its children another parent), then for
  the unit running here to stop at its round's end (asked by SIGTERM, as the kernel's
  `PR_SET_PDEATHSIG` also does), then exits 143: no parent is left to send it another
  unit, and the executor's queue would keep it waiting for one forever. A poll, as
  Linux tells a child of its parent's death by a signal alone, which `signals` takes."""
  while os.getppid() == parent:
    time.sleep(0.2)
  if not signals.received():
    os.kill(os.getpid(), signal.SIGTERM)
  with _running:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(128 + signal.SIGTERM)


def _share_cores(threads: int) -> None:
  """A grid's process on its share of the machine's cores: NumPy's BLAS on one thread
  (`trials.one_blas_thread`), TensorFlow's inter-op pool, which runs the lanes engine's
  kernels side by side (`resident_data.kernel_threads`), on `threads`. A Ray worker that ran
  TensorFlow before keeps its pool (its runs' `runtime_record` says how many)."""
  trials_lib.one_blas_thread()
  try:
    tf.config.threading.set_inter_op_parallelism_threads(threads)
  except RuntimeError:  # TensorFlow's runtime started already
    pass


def _on_ray(run, label: str, *args) -> tuple[Any, str]:
  """A grid's unit `run(*args)` in a Ray task of one CPU (`label` names it to the
  driver): its result and the lines it printed, which the driver shows as the unit ends
  (a Ray worker's output does not reach the driver: `ray_cluster.connect`)."""
  del label
  _share_cores(1)
  printed = io.StringIO()
  with contextlib.redirect_stdout(printed):
    result = run(*args)
  return result, printed.getvalue()
