"""Execution runtimes.

`install_local_runtime` / `ensure_local_runtime`: TFF's C++ runtime with a local
worker that never outlives its Python process (`local_worker`). `workers`: TFF's
runtime over several workers (`--workers`). `inprocess`: the math layer run directly
in one `tf.function` per round (`lanes`: its XLA cohort kernel), no TFF runtime.
"""

from tff_comp.runtime.local_worker import ensure_local_runtime
from tff_comp.runtime.local_worker import install_local_runtime
from tff_comp.runtime.local_worker import shutdown_local_runtime
from tff_comp.runtime.local_worker import worker_pids

__all__ = ['ensure_local_runtime', 'install_local_runtime', 'shutdown_local_runtime',
           'worker_pids']
