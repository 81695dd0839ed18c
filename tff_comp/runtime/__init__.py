"""Runtimes: what runs an algorithm's rounds, behind one interface (`base.Runtime`).

Registered (`registry.RUNTIMES`): 'tff' (`tff_process`: TFF's process on its C++
worker, or split across `workers`), 'inprocess' (`inprocess`: the math layer run in
this process, its cohorts by an engine of `engines`: XLA lanes (`lanes`), mapped, debug)
and 'ray' (`ray`: the in-process math with each round's clients on Ray actors,
across processes and hosts; `--ray_address`).
`install_local_runtime` / `ensure_local_runtime`: TFF's C++ runtime with a local worker
that never outlives its Python process (`local_worker`). `simulation`: the training
loop over any runtime.
"""

from tff_comp.runtime import (
  inprocess,  # noqa: F401  (registers 'inprocess')
  tff_process,  # noqa: F401  (registers 'tff')
)
from tff_comp.runtime import ray as ray_runtime  # noqa: F401  (registers 'ray'; Ray imported when used)
from tff_comp.runtime.local_worker import (
  ensure_local_runtime,
  install_local_runtime,
  shutdown_local_runtime,
  worker_pids,
)

__all__ = ['ensure_local_runtime', 'install_local_runtime', 'shutdown_local_runtime', 'worker_pids']
