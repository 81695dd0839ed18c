"""Execution runtime: a TFF C++ worker that never outlives its Python process."""

from tff_comp.runtime.local_worker import install_local_runtime
from tff_comp.runtime.local_worker import shutdown_local_runtime
from tff_comp.runtime.local_worker import worker_pids

__all__ = ['install_local_runtime', 'shutdown_local_runtime', 'worker_pids']
