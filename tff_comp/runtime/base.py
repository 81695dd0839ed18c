"""The runtime interface: what runs an algorithm's rounds.

An algorithm (`ops.algorithm.Algorithm`) is runtime free; a runtime runs its rounds on
a population of clients. Runtimes are registered by name (`registry.register_runtime`;
built in: 'inprocess', the math in this process, `runtime.inprocess`; 'tff', TFF's
own process on its C++ worker, `runtime.tff_process`; and 'ray', the in-process math
with each round's clients on Ray actors, `runtime.ray`), so another one is one
module:

    @dataclasses.dataclass(frozen=True)
    class MineOptions:  # its settings: flags, defaults, checks (`tff_comp.settings`)
      mine_threads: int = settings.setting(1, 'Threads of my runtime.', lower=1)

    def why_not(program, options: MineOptions) -> str:
      return '' if isinstance(program, Algorithm) else 'it runs Algorithms only'

    @registry.register_runtime('mine', options=MineOptions, auto_rank=5, why_not=why_not)
    def build_mine(program, client_data, options: MineOptions, facts: RunFacts) -> Runtime:
      ...

`program` is an `ops.algorithm.Algorithm` or a TFF `LearningProcess` (a plugin may
register a builder returning a process; only TFF's runtime runs one); `client_data` a
`tff.simulation.datasets.ClientData`. `runtime.choice` picks the runtime ('auto': the
first by `auto_rank` whose `why_not` is empty) and routes each setting to the runtime
owning it; the simulation loop (`run.training_loop`) and the experiment
(`tff_comp.experiment`) use nothing but this interface.
"""

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple, Protocol, runtime_checkable

# The state of a round on every runtime is TFF's `LearningAlgorithmState`, a structure
# with named fields: global_model_weights (ModelWeights), distributor, client_work
# (`ops.client_round.ClientWorkState` for tff_comp's algorithms), aggregator, finalizer
# (the server rule's state, its NamedTuple). Checkpoints save it as NumPy values.
State = Any


class RoundOutput(NamedTuple):
  """One round's result: the new state and the round's metrics (nested OrderedDicts of
  scalars: distributor, client_work, aggregator, finalizer)."""

  state: State
  metrics: Any


class RunFacts(NamedTuple):
  """What a runtime's builder may know of the run besides its own options."""

  batch_size: int | None = None  # examples per batch (for a process taking batches)
  client_rounds: int | None = None  # rounds x clients per round, if known
  resumed: dict[str, Any] | None = None  # the resumed run's runtime record (config.json)


class UnsupportedError(ValueError):
  """A runtime cannot run this program; the message says why in one line."""


@runtime_checkable
class Runtime(Protocol):
  """A built runtime: one algorithm (or process) on one population of clients.

  Attributes:
    name: the registered name ('tff', 'inprocess', 'ray', ...).
    description: one line for the run's header: where rounds run and why (the engine,
      a fallback and its reason).
    record: what `config.json` records of it (name, engine, device, why); kept up to
      date when the runtime changes course (a fallback after the first round).
    keeps_personal_models: `get_personal_weights` returns per-client models (Ditto).
    partial_work: `next` runs clients doing a fraction of their local steps
      (stragglers); a runtime without it raises UnsupportedError for `work` < 1.
    sampler: None, or the loop's sampler where the runtime decides who trains each
      round (buffered async's schedule: `run.buffered_async`); any object with
      `sample(round_num) -> run.sampling.RoundClients` and a `capacity`.

  What a runtime can do beyond rounds is a capability, a protocol of its own that it
  implements (`ClientOutputs`, `BatchesTrials`); who needs one asks with isinstance.
  """

  name: str
  keeps_personal_models: bool
  partial_work: bool
  sampler: Any

  # Read-only: an attribute or a property (a wrapping runtime's, forwarded).
  @property
  def description(self) -> str:
    """One line: where and how rounds run."""

  @property
  def record(self) -> dict[str, Any]:
    """What config.json records of it (`runtime_record`)."""

  def initialize(self) -> State:
    """The state before round 1."""

  def next(
    self, state: State, client_ids: Sequence[str], work: Sequence[float] | None = None
  ) -> RoundOutput:
    """One round on the clients `client_ids` (ids of the client data, at least one; an
    id given twice runs twice). `work`: per client, the fraction of its local steps it
    completes (a straggler: max(1, floor(work x steps)) steps); None: all of them."""

  def reserve_cohort(self, size: int) -> None:
    """Called before round 1 with the largest cohort the run's sampler hands over, so a
    runtime compiling per cohort shape compiles once for every size up to it (else a
    no-op)."""

  def prefetch(self, client_ids: Sequence[str]) -> None:
    """Called before each round with the next round's clients, so a runtime streaming
    client data reads them meanwhile (else a no-op)."""

  def get_model_weights(self, state: State) -> Any:
    """The model to evaluate (ModelWeights of NumPy arrays)."""

  def get_hparams(self, state: State) -> Any:
    """OrderedDict(client_work=..., finalizer=...) of the hyperparameters in force (the
    keys of TFF's own LearningProcesses and of the state's fields)."""

  def set_hparams(self, state: State, hparams: Any) -> State:
    """`state` with the hyperparameters `hparams` (the structure of `get_hparams`)."""

  def get_personal_weights(self, state: State) -> Any:
    """Per-client personal models (tuple of [num_clients, ...] arrays), or None."""

  def whole_state(self, state: State) -> State:
    """`state` with whatever the runtime keeps elsewhere brought in: what a checkpoint
    saves (the Ray runtime's actors hold client state; on other runtimes `state`)."""


@runtime_checkable
class ClientOutputs(Protocol):
  """A capability: each client's outputs of a cohort brought to the host, and the
  stages that end a round from them (`stages.RoundStages`); buffered
  asynchronous steps run on it (`run.buffered_async`). The in-process runtime has it.

  Attributes:
    algorithm: the `ops.algorithm.Algorithm` it runs.
    stages: its round's stages (`stages.RoundStages`).
    device: where its rounds run.
    population_index: {client id: its row in the per-client tables}.
  """

  algorithm: Any
  stages: Any
  device: str
  population_index: Mapping[str, int]

  def client_outputs(
    self,
    payload,
    hparams,
    client_ids: Sequence[str],
    work: Sequence[float],
    indices: Sequence[int],
    round_num: int,
  ) -> Any:
    """The clients' `ops.client_round.ClientOutput`s, stacked in NumPy, from `payload`
    and `hparams` as in round `round_num`."""


@runtime_checkable
class BatchesTrials(Protocol):
  """A capability: a group of trials of its algorithm on its data run as one compiled
  program (`tff_comp.trials`). The in-process runtime has it."""

  def why_not_batched(self) -> str:
    """Why its trials must run one at a time ('' when they can be batched)."""

  def trial_group(self, seeds: Sequence[int], clients: Sequence[Any] | None = None) -> Any:
    """The group of trials with these seeds (`runtime.inprocess.trials.TrialGroup`;
    `clients[t]`: where trial t's clients are, None: this runtime's own)."""


@runtime_checkable
class GroupsTrials(Protocol):
  """A capability of a runtime's settings record: how a grid's trials share that
  runtime's programs (`tff_comp.trial_groups`, `tff_comp.trials`)."""

  data_memory_budget: float  # MB the trials' examples may take, merged into one program

  def trials_agree_on(self) -> tuple[str, ...]:
    """The per-trial settings (config.json names) trials must agree on to share one
    program (the in-process runtime's 'auto' engine is chosen by a run's length)."""


@runtime_checkable
class StartsChains(Protocol):
  """A capability: its runs start the model aggregator chain from a given state (a
  trial's own settings that the chain's state holds, `settings.setting(chain_state=
  True)`), so trials differing only there share one build (`tff_comp.trials`). The
  in-process runtime, Ray's and buffered async steps have it; TFF's bakes the settings
  into its factories."""

  def starting_chain_at(self, chain_state: Any) -> 'Runtime':
    """This runtime (its builds shared), its `initialize` holding `chain_state`
    (an `ops.aggregators.ChainState`) as the chain's."""


def server_state(state: State) -> Any:
  """The server rule's state (what defines the method at this round)."""
  return state.finalizer
