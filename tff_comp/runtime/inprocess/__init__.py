"""The in-process runtime: an `ops.algorithm.Algorithm` run directly in TensorFlow.

TFF's C++ worker pays a fixed cost per intrinsic and per client (docs/speed.md) and
has no GPU build. This runtime runs the same math layer (`ops.client_round`,
`ops.update_aggregation`, server rules) as one `tf.function` per round, never building a TFF
computation:

* client data stay resident on the device in variables (`resident_data.ResidentData`);
* the cohort's plans come from the one batch plan (`ops.client_round.plan_cohort`);
* an engine (`runtime.inprocess.engines`: lanes, mapped, debug) runs the cohort's client work;
* aggregation (with clipping or DP noise for a `privacy.PrivateMean` model
  aggregator, its state in the state's `aggregator` field), the server step and the
  round's metrics are computed in the same graph.

`InProcessRuntime` implements `runtime.base.Runtime` (registered as 'inprocess'); its
state is TFF's `LearningAlgorithmState`, as the TFF process's, and it gives the same
results (parity tests per algorithm). Device: the first GPU TensorFlow sees, else the
CPU (`choose_device`). Capabilities (`runtime.base`): `ClientOutputs` (a round's
clients alone: Ray's actors, buffered async) and `BatchesTrials` (`trials`).
"""

import dataclasses

from tff_comp import data as data_lib
from tff_comp import models, registry, settings
from tff_comp.learning_process import composer
from tff_comp.ops import algorithm as algorithm_lib
from tff_comp.runtime import base
from tff_comp.runtime.inprocess import resident_data, streaming
from tff_comp.runtime.inprocess import rounds as inprocess_rounds

UnsupportedError = base.UnsupportedError
InProcessRuntime = inprocess_rounds.InProcessRuntime
ENGINES = inprocess_rounds.ENGINES
choose_device = resident_data.choose_device
# A population of this many clients or more streams each cohort in a run that trains
# fewer client-rounds than it has clients (the lanes engine not asked for): reading every
# client first cost more than the run (2 rounds of synthetic EMNIST's 3,400 writers
# waited minutes for them). Smaller ones load whole, as batched trials need.
STREAM_SHORT_RUNS_FROM = 1000


@dataclasses.dataclass(frozen=True)
class InProcessOptions:
  """The in-process runtime's settings."""

  engine: str = settings.setting(
    'auto',
    "The in-process runtime's engine: lanes (XLA, many small clients), mapped"
    ' (client by client), debug (eager; a failure names the client and stage), or auto'
    ' (lanes where the local step suits XLA).',
    choices=ENGINES,
  )
  data_memory_budget: float = settings.setting(
    4096.0,
    "MB the clients' examples may take resident on the in-process runtime; a"
    " population estimated larger streams each round's cohort from its ClientData"
    ' instead (the next cohort read while a round runs; mapped engine). 0: always'
    ' stream.',
    lower=0.0,
    resumable=True,
  )
  kernel_threads: int = settings.setting(
    0,
    "Threads the lanes engine runs a round's clients on, a balanced share each (the"
    ' same results); 0: the CPU cores this process may use (one on a GPU).',
    lower=0,
    resumable=True,
  )

  def __post_init__(self):
    settings.check(self)

  def trials_agree_on(self) -> tuple[str, ...]:
    """'auto' picks the engine by the run's length (`engines.AUTO_LANES_MIN_STEPS`):
    trials share a program only with the engine each one's separate run takes, so of
    one length (`base.GroupsTrials`)."""
    return ('rounds', 'clients_per_round') if self.engine == 'auto' else ()


def why_not(program, options: InProcessOptions | None = None) -> str:
  """Why the in-process runtime cannot run `program` ('' when it can): a process
  composed from hand-built blocks (no Algorithm), a model aggregator that is a TFF
  factory (TFF's own runtime runs those; the aggregator blocks, `ops.aggregators`, and
  `ops.privacy.PrivateMean` run here), or a Keras model converted by TFF. `options`
  are not consulted: every engine runs these."""
  del options
  program = composer.algorithm_of(program)
  if not isinstance(program, algorithm_lib.Algorithm):
    return (
      'this process was composed from hand-built blocks, not an Algorithm; run it on'
      ' the TFF runtime.'
    )
  if program.model_aggregator is not None and program.model_chain is None:
    return (
      f'its model_aggregator is a TFF factory'
      f' ({type(program.model_aggregator).__name__}), which runs on the TFF runtime'
      ' only; the aggregator blocks of ops.aggregators (--aggregator, --compression,'
      ' --secure_aggregation) run in-process'
    )
  return models.why_not_callable_outside_tff(program.model)


def build(
  program,
  client_data,
  *,
  engine: str = 'auto',
  lanes: int | None = None,
  device: str | None = None,
  client_rounds: int | None = None,
  data_memory_budget: float | None = None,
  kernel_threads: int | None = None,
) -> InProcessRuntime:
  """The in-process runtime for an Algorithm (or a process composed from one) on
  `client_data`.

  Args:
    engine: 'auto', 'lanes', 'mapped' or 'debug' (`runtime.inprocess.engines`).
    lanes: clients stepping together on the lanes engine (default: `InProcessRuntime`'s).
    device: a TensorFlow device name (default: the first GPU, else the CPU).
    client_rounds: the run's rounds x clients per round, if known (`InProcessRuntime`).
    data_memory_budget: MB the clients' examples may take resident on the device; a
      population estimated larger (`streaming.estimate_bytes`) streams each round's
      cohort instead (`streaming.StreamedData`, mapped engine), and says so, as does a
      run of fewer `client_rounds` than a large population's clients
      (`STREAM_SHORT_RUNS_FROM`). None: always resident.
    kernel_threads: threads of the lanes engine's kernels (`InProcessRuntime`).

  Raises:
    UnsupportedError: what `why_not` names.
  """
  reason = why_not(program)
  if reason:
    raise UnsupportedError(reason)
  return _build(
    composer.algorithm_of(program),
    client_data,
    engine=engine,
    lanes=lanes,
    device=device,
    client_rounds=client_rounds,
    data_memory_budget=data_memory_budget,
    kernel_threads=kernel_threads,
  )


def _build(
  program: algorithm_lib.Algorithm,
  client_data,
  *,
  data_memory_budget: float | None,
  device: str | None,
  **options,
) -> InProcessRuntime:
  """`build` for a program `why_not` accepted."""
  why = ''
  population = len(client_data.client_ids)
  client_rounds = options.get('client_rounds')
  if data_memory_budget is not None:
    resident = streaming.estimate_bytes(client_data) / 2**20
    if resident > data_memory_budget:
      why = (
        f"streaming each cohort's data: the population's examples, about"
        f' {resident:,.0f} MB, exceed --data_memory_budget={data_memory_budget:g} MB'
      )
    elif (
      streaming.streams(client_data)
      and population >= STREAM_SHORT_RUNS_FROM
      and client_rounds is not None
      and client_rounds < population
      and options.get('engine') != 'lanes'
    ):
      why = (
        f"streaming each cohort's data: the run trains {client_rounds:,} client-rounds"
        f' of a population of {population:,}, fewer than reading every client first'
      )
  if why:
    data = streaming.StreamedData(
      client_data, device or choose_device(), with_keys=program.client_options.uses_client_key
    )
    return InProcessRuntime(program, data, device=device, why_streaming=why, **options)
  return InProcessRuntime(program, data_lib.client_arrays(client_data), device=device, **options)


@registry.register_runtime(
  'inprocess', options=InProcessOptions, auto_rank=0, why_not=why_not, label='in-process'
)
def build_from_settings(
  program, client_data, options: InProcessOptions, facts: base.RunFacts
) -> InProcessRuntime:
  """`build` with the run's settings; resuming with engine 'auto', the engine the run
  used (auto picks by the run's length, and a resume may change --rounds: the same
  engine keeps the resumed run bit for bit equal to an uninterrupted one)."""
  engine = options.engine
  resumed = facts.resumed or {}
  if engine == 'auto' and resumed.get('name') == 'inprocess':
    engine = resumed.get('engine') or 'auto'
  return _build(
    composer.algorithm_of(program),
    client_data,
    engine=engine,
    lanes=None,
    device=None,
    client_rounds=facts.client_rounds,
    data_memory_budget=options.data_memory_budget,
    kernel_threads=options.kernel_threads,
  )
