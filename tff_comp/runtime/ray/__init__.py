"""A run's cohorts across processes and hosts, on Ray: the in-process runtime's math with
each round's clients run by Ray actors.

    driver: the state, the payload P = server_rule.payload(S, W); for rules with a
            reference loss, the largest of every actor's clients' candidates
    actor k (holds the clients i with i mod K = k, resident or streamed as in-process):
            its clients of the cohort: their work from P on the in-process engine the
            whole run would take -> their sums for the round's end
            (`stages.RoundStages.sums`: sum_i w_i update_i, sum_i w_i, the
            statistics; with a private aggregator each client clipped first, with the
            clip the driver sends)
    driver: the actors' sums added, then the round's end as in-process
            (`RoundStages.finish_sums`: the means, DP noise once, the server step,
            metrics), checkpoints and metrics as every run

Each client's work is its own whatever runs it, and the round's end is the single
process's on the same sums, added in another order: a run on K actors equals the
in-process run to float rounding (1e-6, `tests/test_ray.py`). An actor sends one
update's worth of sums whatever its number of clients (bench part 3 prints the bytes),
and the rows below.
Per-client tables travel as the actor's clients' rows (`client_rows`), so its messages
grow with its clients, not with the population. Client state (SCAFFOLD's c_i, Ditto's
personal models, Local-MOML's memory: a server state's `client_state`) lives with the
actors: each holds its clients' rows, the driver's state a `client_rows.Held` in each
table's place. In a round an actor fills its clients' rows into their payload and
returns their rows as they were; the driver runs the server step on the round's rows
alone (`ops.rule` says why a rule's step allows it) and sends each actor its clients'
new rows. The whole tables come to the driver only for a checkpoint, personal models
and an interrupted round's save (`whole_state`); a whole state handed to `next` (the
initial state, a restored checkpoint) is sent to the actors. AFL's weights on the
simplex, projected whole, stay in the driver's state.

An actor that dies in a round is restarted by Ray (`max_restarts`) and set up again on
its shard, its rows of client state restored (from the last snapshot of them, in Ray's
object store, and the rows sent since, which the driver keeps up to `JOURNAL_BYTES` an
actor before asking for a new snapshot), and its part of the round runs again there:
the round is pure, the results
unchanged; one line says so. A process's actors serve each of its runs in turn (their
processes and TensorFlow imported once): a run whose actors another run took since sets
them up for itself again, its rows of client state restored. The driver killed,
`--resume` continues from the last checkpoint as for any run. Ray is an optional
dependency (`pip install tff_comp[ray]`); it is imported when a run asks for it
(`--ray_address`).
"""

from tff_comp import registry
from tff_comp.learning_process import composer
from tff_comp.runtime import base, inprocess
from tff_comp.runtime.ray import actors as ray_actors
from tff_comp.runtime.ray import cluster as ray_cluster
from tff_comp.runtime.ray import rounds as ray_rounds

RayOptions = ray_cluster.RayOptions
RayRuntime = ray_rounds.RayRuntime
RoundCosts = ray_rounds.RoundCosts


def why_not(program, options: RayOptions | None) -> str:
  """Why the Ray runtime cannot run `program` ('' when it can): what the in-process
  runtime cannot run, no `--ray_address`, or an aggregator chain whose clients keep
  persistent rows (error feedback's, kept by the in-process runtime's state) or whose
  encoding reads the whole cohort (ALIE), which the actors split."""
  if options is None or not options.ray_address:
    return 'no --ray_address'
  reason = inprocess.why_not(program)
  if reason:
    return reason
  chain = composer.algorithm_of(program).model_chain
  if chain is not None and chain.row_size:
    return (
      f'the aggregator {chain.name} keeps a row per client (error feedback, worker momentum),'
      " which Ray's actors do not hold yet; run it in-process"
    )
  if chain is not None and chain.cohort_wide:
    return (
      f"the aggregator {chain.name} reads the whole cohort in each client's encoding,"
      " which Ray's actors split; run it in-process"
    )
  return ''


def build(
  program,
  client_data,
  options: RayOptions,
  *,
  engine: str = 'auto',
  client_rounds: int | None = None,
  data_memory_budget: float = inprocess.InProcessOptions.data_memory_budget,
) -> RayRuntime:
  """The Ray runtime of an Algorithm (or a process composed from one) on `client_data`,
  over the in-process runtime `inprocess.build` gives for `engine`, `client_rounds`
  and `data_memory_budget` (the engine a run of that length takes alone).

  Raises:
    base.UnsupportedError: what `why_not` names; Ray missing or out of reach.
  """
  reason = why_not(program, options)
  if reason:
    raise base.UnsupportedError(reason)
  algorithm = composer.algorithm_of(program)
  try:
    shipped = ray_actors.dumps(algorithm)
  except (TypeError, AttributeError) as e:
    raise base.UnsupportedError(f'the algorithm cannot be sent to Ray actors ({e})') from e
  # Built as each actor's runtime is (the run's description and record say the driver's).
  driver = inprocess.build(
    algorithm,
    client_data,
    engine=engine,
    client_rounds=client_rounds,
    data_memory_budget=data_memory_budget,
    kernel_threads=ray_actors.ACTOR_KERNEL_THREADS,
  )
  return RayRuntime(driver, shipped, client_data, options, data_memory_budget)


@registry.register_runtime('ray', options=RayOptions, auto_rank=None, why_not=why_not, label='ray')
def build_from_settings(
  program, client_data, options: RayOptions, facts: base.RunFacts
) -> RayRuntime:
  """`build` with the run's settings: the engine the in-process runtime would take
  (`inprocess.build_from_settings`; resumed, the one the run ran)."""
  engine = (facts.resumed or {}).get('engine') or 'auto'
  return build(program, client_data, options, engine=engine, client_rounds=facts.client_rounds)
