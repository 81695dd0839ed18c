"""The Ray runtime (`runtime.ray`): a run's clients on two actors of a local Ray
cluster equal the single-process run (to 1e-6: each actor sends its clients' sums, added
in another order than one process's), for every registered algorithm that
runs in-process (Poisson cohorts with dropout, shuffled local data, DP); an actor killed
in a run is restarted and the run is unchanged; a Ray run resumes as it would have run;
an unreachable cluster is one line; a grid's units run as Ray tasks. The cluster is
started once for the module and shut down after it (conftest fails the session on a Ray
process left running). Tests marked `ray` run under `make test-ray` (every one, with
the rest), the others in the default suite."""

import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import psutil
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tests import algorithm_cases
from tff_comp import experiment, keras_models, registry, strategy_cache
from tff_comp.binaries import grid, reproductions
from tff_comp.ops import privacy
import tff_comp.ops.aggregators as agg
from tff_comp.run import callbacks, outputs, sampling
from tff_comp.runtime import client_rows, inprocess
from tff_comp.runtime import ray as ray_runtime
from tff_comp.runtime.inprocess import streaming
from tff_comp.runtime.ray import cluster as ray_cluster

ray = pytest.importorskip('ray')
cloudpickle = ray.cloudpickle

DATA = algorithm_cases.DATA['unequal']
IDS = list(DATA.client_ids)
OPTIONS = ray_runtime.RayOptions(ray_address=ray_cluster.LOCAL, ray_actors=2)


@pytest.fixture(scope='module', autouse=True)
def cluster():
  ray_cluster.connect(ray_cluster.LOCAL)
  yield
  ray.shutdown()


def _algorithms() -> list[str]:
  return [
    name
    for name in registry.ALGORITHMS.names()
    if not inprocess.why_not(algorithm_cases.algorithm(name, {}))
  ]


def _sampler() -> sampling.ClientSampler:
  """Poisson cohorts (3 of the clients expected) with dropout."""
  return sampling.ClientSampler(IDS, 3, 7, sampling.Participation('poisson', dropout_rate=0.2))


def _rounds(runtime, rounds: int = 3, kill=None):
  """Rounds on `_sampler`'s cohorts; `kill(round)` runs before each round, and as
  `kill(rounds + 1)` before the state is gathered whole."""
  sampler = _sampler()
  state, metrics = runtime.initialize(), []
  for round_num in range(1, rounds + 1):
    if kill:
      kill(round_num)
    clients = sampler.sample(round_num)
    if clients.reporting:
      output = runtime.next(state, list(clients.reporting), clients.work)
      state = output.state
      metrics.append(output.metrics)
  if kill:
    kill(rounds + 1)
  return runtime.whole_state(state), metrics


def _assert_same(got, want, label):
  for a, b in zip(tf.nest.flatten(got), tf.nest.flatten(want), strict=True):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7, err_msg=label)


def _both(name, engine, extra=None, data=DATA):
  """(the single process's rounds, the same on two Ray actors)."""

  def algorithm():  # one each: a run traces the algorithm's functions
    return algorithm_cases.algorithm(name, extra or {}, shuffle=True)

  single = _rounds(inprocess.build(algorithm(), data, engine=engine))
  on_ray = ray_runtime.build(algorithm(), data, OPTIONS, engine=engine)
  return single, _rounds(on_ray), on_ray


@pytest.mark.ray
def test_a_client_data_that_does_not_pickle_reaches_the_actors_as_arrays():
  """TFF's TestClientData's dataset function holds the ClientData, which Ray cannot
  pickle (bench part 3's EMNIST line failed on it): its clients go as arrays."""
  data = tff.simulation.datasets.TestClientData(
    {c: tuple(np.asarray(t) for t in streaming.read_client(DATA, c)) for c in IDS}
  )
  single, on_ray, runtime = _both('fedavg', 'mapped', data=data)
  assert runtime.record['shipped_data'] == 'arrays'
  _assert_same(on_ray, single, 'TestClientData')


@pytest.mark.ray
def test_each_actor_sends_sums_of_one_updates_size_whatever_its_clients():
  runtime = ray_runtime.build(
    algorithm_cases.algorithm('fedavg', {}), DATA, OPTIONS, engine='mapped'
  )
  state, received = runtime.initialize(), []
  for cohort in (IDS[:2], IDS):  # a client on each actor, then every client
    runtime.next(state, cohort)
    received.append(runtime.costs.received)
  weights = sum(
    np.asarray(w).nbytes for w in tf.nest.flatten(runtime.get_model_weights(state).trainable)
  )
  assert len(IDS) > 4 and received[0] == received[1] < 2 * weights + 1024


@pytest.mark.ray
@pytest.mark.parametrize('name', ['scaffold', 'ditto'])
def test_what_an_actor_sends_and_receives_does_not_grow_with_the_population(name):
  """Per-client tables (SCAFFOLD's c_i, Ditto's personal models) travel as the actor's
  clients' rows: one round of the same two clients costs the same bytes on a population
  of 5 as on one of 10 (its first 5 clients the same), and the states agree."""
  costs, states = [], []
  for data, population in ((DATA, 5), (algorithm_cases.TEN, 10)):
    runtime = ray_runtime.build(
      algorithm_cases.algorithm(name, dict(num_clients=population)), data, OPTIONS, engine='mapped'
    )
    output = runtime.next(runtime.initialize(), ['c0', 'c1'])
    costs.append(runtime.costs[:2])
    states.append(runtime.get_model_weights(output.state).trainable)
  assert costs[0] == costs[1], costs
  _assert_same(states[1], states[0], name)


def _client_state_runs(name: str, rounds: int = 3):
  """(the Ray runtime, its states after each round, the single process's)."""

  def run(runtime):
    sampler = sampling.ClientSampler(IDS, 3, 7)
    states = [runtime.initialize()]
    for round_num in range(1, rounds + 1):
      states.append(runtime.next(states[-1], list(sampler.sample(round_num).reporting)).state)
    return states[1:]

  on_ray = ray_runtime.build(algorithm_cases.algorithm(name, {}), DATA, OPTIONS, engine='mapped')
  return (
    on_ray,
    run(on_ray),
    run(inprocess.build(algorithm_cases.algorithm(name, {}), DATA, engine='mapped')),
  )


@pytest.mark.parametrize(
  'name',
  ['scaffold', *(pytest.param(n, marks=pytest.mark.ray) for n in ('local_moml', 'ditto'))],
)
def test_client_state_lives_with_the_actors(name):
  """The driver's state holds a `Held` in each table's place of client state (SCAFFOLD's
  c_i, Local-MOML's memory and `seen`, Ditto's personal models); the tables gathered
  back equal the single process's after every round, the round before the last
  included (an interrupted round's save), as do Ditto's personal models to evaluate,
  and `server/seen` (a counted table's sum) is the same."""
  runtime, states, single = _client_state_runs(name)
  server = states[-1].finalizer
  fields = client_rows.held_fields(server)
  assert fields and all(
    isinstance(leaf, client_rows.Held)
    for field in fields
    for leaf in tf.nest.flatten(getattr(server, field))
  )
  for got, want, label in ((states[-1], single[-1], 'last'), (states[-2], single[-2], 'before')):
    _assert_same(runtime.whole_state(got), want, f'{name}, {label}')
  assert callbacks.server_quantities(states[-1]) == callbacks.server_quantities(single[-1])
  if runtime.keeps_personal_models:
    _assert_same(
      runtime.get_personal_weights(states[-1]), single[-1].finalizer.personal, 'personal models'
    )
  with pytest.raises(ValueError, match='earlier round than its actors hold'):
    runtime.whole_state(states[-3])


@pytest.mark.ray
def test_a_whole_state_given_again_is_sent_to_the_actors():
  """A whole state (the initial one, a restored checkpoint) handed to a Ray runtime that
  holds later rows replaces them: its rounds are the single process's again; a held
  state older than the actors' rows is refused in one line."""
  runtime, states, single = _client_state_runs('scaffold', rounds=2)
  with pytest.raises(ValueError, match='earlier round than its actors hold'):
    runtime.next(states[0], IDS[:2])
  again = runtime.next(runtime.initialize(), IDS[:3]).state
  want = inprocess.build(algorithm_cases.algorithm('scaffold', {}), DATA, engine='mapped')
  _assert_same(
    runtime.whole_state(again),
    want.next(want.initialize(), IDS[:3]).state,
    'from the initial state again',
  )
  del single


@pytest.mark.ray
def test_two_ray_runs_of_one_process_take_turns_on_its_actors():
  """A process's actors serve one run at a time: a run built later (Ditto) sets them up
  for itself, and the earlier run (SCAFFOLD) takes them back, its rows of client state
  restored; each equals its single-process run."""

  def runtimes(build):
    return [build(algorithm_cases.algorithm(name, {}), DATA) for name in ('scaffold', 'ditto')]

  on_ray = runtimes(lambda a, d: ray_runtime.build(a, d, OPTIONS, engine='mapped'))
  single = runtimes(lambda a, d: inprocess.build(a, d, engine='mapped'))
  states = [[r.initialize() for r in on_ray], [r.initialize() for r in single]]
  for cohort in (IDS[:3], IDS[1:4], IDS[2:]):
    for kind, runs in enumerate((on_ray, single)):
      for i, runtime in enumerate(runs):
        states[kind][i] = runtime.next(states[kind][i], cohort).state
  for runtime, got, want in zip(on_ray, states[0], states[1]):
    _assert_same(runtime.whole_state(got), want, runtime.description)


# The default suite runs SCAFFOLD (a round's plain sums and per-client state on Ray);
# `make test-ray` runs every algorithm and the tests marked `ray` (the suite's time
# budget).
_DEFAULT = ('scaffold',)


@pytest.mark.parametrize(
  'name',
  [
    name if name in _DEFAULT else pytest.param(name, marks=pytest.mark.ray)
    for name in _algorithms()
  ],
)
def test_two_actors_equal_the_single_process(name):
  single, on_ray, runtime = _both(name, 'mapped')
  assert runtime.record['actors'] == 2 and runtime.record['engine'] == 'mapped'
  _assert_same(on_ray, single, name)


@pytest.mark.ray
@pytest.mark.parametrize('name', ['fedavg', 'scaffold'])
def test_two_actors_equal_the_single_process_on_lanes(name):
  single, on_ray, _ = _both(name, 'lanes')
  _assert_same(on_ray, single, name)


@pytest.mark.ray
@pytest.mark.parametrize(
  'spec',
  [
    privacy.GaussianMean(0.5, 0.8, 3.0),
    privacy.AdaptiveGaussianMean(0.5, 0.8, 3.0, clipped_count_stddev=0.5),
    agg.Chain((agg.Clip(0.5), agg.Quantize(6)), agg.Median()),
    agg.Chain((agg.SignFlip(0.3), agg.RandK(0.5)), agg.SecureSum(4.0, 16)),
    privacy.TreeNoisedMean(0.5, 0.8, 3.0, restart_every=2),
    privacy.BandedNoisedMean(0.5, 0.8, 3.0, strategy=strategy_cache.strategy(3, 2)),
  ],
  ids=[
    'dp',
    'dp_adaptive',
    'clip_quantize_median',
    'attack_rand_k_secure_sum',
    'dp_ftrl_tree',
    'dp_bandmf',
  ],
)
def test_aggregators_on_ray_equal_the_single_process(spec):
  """DP's noise once (the tree's nodes and BandMF's correlated noise across the rounds
  too, restarts included); a median of the rows the actors send; per-client draws
  (rounding, coordinates, attackers) alike wherever a client runs."""
  single, on_ray, _ = _both(
    'fedavg', 'mapped', dict(model_aggregator=spec, client_weighting='uniform')
  )
  _assert_same(on_ray, single, getattr(spec, 'kind', None))


def test_a_chain_ray_cannot_hold_yet_is_refused_in_one_line():
  for chain, says in (
    (agg.Chain((agg.ErrorFeedback(agg.TopK(0.5)),), agg.Mean()), 'keeps a row per client'),
    (agg.Chain((agg.ALIE(0.2),), agg.Median()), 'reads the whole cohort'),
  ):
    algorithm = algorithm_cases.algorithm(
      'fedavg', dict(model_aggregator=chain, client_weighting='uniform')
    )
    assert says in ray_runtime.why_not(algorithm, OPTIONS)


def test_gpus_the_cluster_cannot_give_are_refused_before_any_actor_waits():
  """--ray_gpus_per_actor=1 on a host without GPUs waited forever with no message (Ray
  holds an actor until a node has its resources). 10^6 GPUs: no node has them."""
  options = ray_runtime.RayOptions(
    ray_address=ray_cluster.LOCAL, ray_actors=2, ray_gpus_per_actor=1e6
  )
  with pytest.raises(ray_runtime.base.UnsupportedError, match='can place 0 such actor'):
    ray_runtime.build(algorithm_cases.algorithm('fedavg', {}), DATA, options)


@pytest.mark.ray
def test_a_keras_cnn_on_ray_equals_the_single_process():
  """A Keras model reaches the actors as its conversion (`keras_models._KerasModel`
  pickles as `from_keras` of its Keras model): a copied function took no gradient."""
  from tests import test_keras_models as k

  data = k._data('cnn')

  def algorithm():
    model = keras_models.from_keras(k._cnn(), k.LOSS, k._spec('cnn'))
    return (
      registry.get_algorithm('fedavg')
      .build(model, client_learning_rate=0.1, batch_size=k.BATCH)
      .with_client_options(shuffle=True)
    )

  def rounds(runtime):
    state = runtime.initialize()
    for r in range(2):
      state = runtime.next(state, k.IDS[r : r + 3]).state
    return state

  _assert_same(
    rounds(ray_runtime.build(algorithm(), data, OPTIONS, engine='mapped')),
    rounds(inprocess.build(algorithm(), data, engine='mapped')),
    'keras cnn',
  )


class _KillingRay:
  """Ray's module for a runtime, which kills the process `armed` (then disarmed) at the
  first `get` after it is armed: in a round, once its clients' work was sent."""

  def __init__(self, ray_module):
    self._ray, self.armed = ray_module, None

  def __getattr__(self, name):
    return getattr(self._ray, name)

  def get(self, *args, **kwargs):
    if self.armed:
      os.kill(self.armed, signal.SIGKILL)
      self.armed = None
    return self._ray.get(*args, **kwargs)


@pytest.mark.ray
def test_an_actor_killed_in_a_run_is_restarted_and_the_run_is_unchanged(capsys):
  """SCAFFOLD (each actor holds its clients' c_i): an actor killed between rounds 1 and
  2, one of round 3's killed while its clients run, and one before the tables are
  gathered (`whole_state`, a checkpoint's); each is restarted with its rows, and the
  run is the single process's."""
  single, _, runtime = _both('scaffold', 'mapped')
  runtime._ray = killing = _KillingRay(runtime._ray)
  in_round_3 = IDS.index(_sampler().sample(3).reporting[0]) % 2  # an actor of round 3
  killed = []

  def kill(round_num):
    if round_num == 2:
      killed.append(runtime.actor_pids()[0])
      os.kill(killed[-1], signal.SIGKILL)
    if round_num == 3:
      killed.append(runtime.actor_pids()[in_round_3])
      killing.armed = killed[-1]  # once the round's clients were sent
    if round_num == 4:
      killed.append(runtime.actor_pids()[1])
      os.kill(killed[-1], signal.SIGKILL)

  _assert_same(_rounds(runtime, kill=kill), single, 'scaffold, actors killed')
  out = capsys.readouterr().out
  for line in (
    'ray: actor 0 died in round 2; its clients run again on its restarted actor.',
    f'ray: actor {in_round_3} died in round 3; its clients run again on its restarted actor.',
    'ray: actor 1 died; it is restarted with its rows of client state.',
  ):
    assert line in out, out
  assert len(killed) == 3 and not set(killed) & set(runtime.actor_pids())  # new processes


def _train(path, **settings):
  prepared = experiment.prepare(
    experiment.ExperimentConfig.of(
      **{
        'algorithm': 'fedavg',
        'task': 'quadratic',
        'rounds': 6,
        'eval_period': 3,
        'checkpoint_every': 2,
        'ray_address': ray_cluster.LOCAL,
        'output_dir': str(path),
        **settings,
      }
    )
  )
  runner = experiment.build_runner(prepared)
  assert runner.runtime.name == 'ray'
  return experiment.train_runner(prepared, runner, show_progress=False)


@pytest.mark.parametrize('name', [pytest.param('fedavg', marks=pytest.mark.ray), 'scaffold'])
def test_a_ray_run_resumes_as_it_would_have_run(tmp_path, name):
  """SCAFFOLD's: its checkpoints hold the c_i the actors held (`whole_state`)."""
  whole = _train(tmp_path / 'whole', algorithm=name)
  _train(tmp_path / 'cut', rounds=3, algorithm=name)
  # Round 3's checkpoint is readable (a table left with the actors would be an object
  # that resuming sets aside, starting from round 0 and ending the same).
  with np.load(tmp_path / 'cut' / 'checkpoints' / 'state_3.npz', allow_pickle=False) as saved:
    assert all(saved[leaf].dtype != object for leaf in saved.files)
  resumed = _train(tmp_path / 'cut', resume=True, algorithm=name)
  assert resumed == whole
  (want, _), (got, _) = (
    outputs.whole_rows(tmp_path / kind / 'metrics.csv')[1:] for kind in ('whole', 'cut')
  )
  columns = [c for c in want[0] if 'seconds' not in c]
  assert [[r[c] for c in columns] for r in got] == [[r[c] for c in columns] for r in want]


def test_an_unreachable_cluster_is_one_line_and_exit_2(repo_root, tmp_path):
  out = subprocess.run(
    [
      sys.executable,
      str(repo_root / 'binaries' / 'run.py'),
      '--algo=fedavg',
      '--task=quadratic',
      '--rounds=2',
      '--ray_address=127.0.0.1:9',
      f'--output_dir={tmp_path}',
    ],
    capture_output=True,
    text=True,
    timeout=300,
    stdin=subprocess.DEVNULL,
    env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3'),
  )
  assert out.returncode == 2, out.stderr[-2000:]
  lines = [line for line in out.stderr.splitlines() if line.strip()]
  assert (
    len(lines) == 1 and 'Ray cluster at --ray_address=127.0.0.1:9 cannot be reached' in lines[0]
  ), out.stderr[-2000:]


@pytest.mark.ray
def test_a_ray_run_ends_without_a_traceback(repo_root, tmp_path):
  """run.py on a local Ray cluster exits 0 with nothing on stderr: TFF's default
  context used to print an "Exception ignored" traceback at the interpreter's exit."""
  out = subprocess.run(
    [
      sys.executable,
      str(repo_root / 'binaries' / 'run.py'),
      '--algo=fedavg',
      '--task=quadratic',
      '--rounds=2',
      '--ray_address=local',
      '--ray_actors=1',
      f'--output_dir={tmp_path}',
    ],
    capture_output=True,
    text=True,
    timeout=300,
    stdin=subprocess.DEVNULL,
    env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3'),
  )
  assert out.returncode == 0, out.stderr[-2000:]
  assert 'Traceback' not in out.stderr and 'Exception ignored' not in out.stderr, out.stderr


@pytest.mark.ray
def test_the_drivers_line_about_a_metrics_agent_is_kept_out(repo_root):
  """Ray's core package starts no metrics agent, and its driver logged so about 30 s
  after joining (`ray_cluster._NO_METRICS_AGENT`); a task's work and the driver's own
  lines pass."""
  script = (
    'import sys, time\n'
    'from tff_comp.runtime.ray import cluster as ray_cluster\n'
    "ray = ray_cluster.connect('local')\n"
    'double = ray.remote(num_cpus=1)(lambda x: 2 * x)\n'
    "print('sum', sum(ray.get([double.remote(i) for i in range(4)])), file=sys.stderr)\n"
    'time.sleep(45)\n'
    "print('done', file=sys.stderr)\n"
  )
  out = subprocess.run(
    [sys.executable, '-c', script],
    capture_output=True,
    text=True,
    timeout=300,
    cwd=repo_root,
    stdin=subprocess.DEVNULL,
    env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3'),
  )
  assert out.returncode == 0, out.stderr[-2000:]
  assert out.stderr.splitlines() == ['sum 12', 'done'], out.stderr


def _tiny_grid() -> reproductions.Reproduction:
  return reproductions.Reproduction(
    task='quadratic',
    algorithms=('fedavg', 'fedprox'),
    client_learning_rates=(0.01, 0.03),
    server_learning_rates=(1.0,),
    rounds=4,
    checkpoints=(2, 4),
    metric='distance_to_optimum',
    higher_is_better=False,
    eval_period=2,
  )


@pytest.mark.ray
def test_a_grid_on_ray_tasks_equals_the_grid_run_here(tmp_path, capsys):
  here = grid.run_grid('here', _tiny_grid(), 4, (0, 1), tmp_path / 'here')
  capsys.readouterr()
  on_ray = grid.run_grid(
    'ray', _tiny_grid(), 4, (0, 1), tmp_path / 'ray', ray_address=ray_cluster.LOCAL
  )
  assert on_ray == here
  # The driver shows each unit's own lines as it ends, and the grid's progress (a Ray
  # worker's output does not reach it).
  out = capsys.readouterr().out
  assert re.search(r'ray: fedavg done \([12] of 2 units, \d+s\)', out), out
  assert 'fedprox on quadratic: 4 trials batched into one program' in out, out


def _crash_first(marker: str, value: int) -> int:
  """value * 2, its worker process dying the first time it runs (`marker` absent)."""
  if not os.path.exists(marker):
    open(marker, 'w').close()
    os._exit(1)  # the worker process dies with the task
  return value * 2


def test_a_task_lost_with_its_worker_runs_again(tmp_path, capsys):
  cloudpickle.register_pickle_by_value(sys.modules[__name__])  # tests/ is not on the
  try:  # workers' path
    results = ray_cluster.run_tasks(
      _crash_first,
      [(str(tmp_path / 'crashed'), 21)],
      again=lambda call: (call[0], call[1]),
      label=lambda call: 'the unit',
    )
  finally:
    cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
  assert results == [42]
  assert (
    'ray: the task of the unit was lost with its worker; it runs again.' in capsys.readouterr().out
  )


def _ray_run(repo_root, path, rows: int = 3) -> subprocess.Popen:
  """run.py training on a local Ray cluster of one actor, once metrics.csv has `rows`
  rounds."""
  proc = subprocess.Popen(
    [
      sys.executable,
      str(repo_root / 'binaries' / 'run.py'),
      '--algo=fedavg',
      '--task=quadratic',
      '--rounds=100000',
      '--eval_period=100000',
      '--checkpoint_every=100000',
      '--ray_address=local',
      '--ray_actors=1',
      f'--output_dir={path}',
    ],
    stdout=subprocess.DEVNULL,
    stderr=subprocess.PIPE,
    text=True,
    stdin=subprocess.DEVNULL,
    env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3'),
  )
  # A guard against a hang, not a budget: the run's start (a local cluster, an actor
  # importing TensorFlow) took over 4 minutes at load 11 on 2 cores.
  deadline, csv = time.monotonic() + 900, path / 'metrics.csv'
  while not csv.exists() or len(csv.read_text().splitlines()) < rows + 2:
    if proc.poll() is not None or time.monotonic() > deadline:
      proc.kill()
      pytest.fail(f'run.py on Ray did not train: {proc.communicate()[1][-2000:]}')
    time.sleep(0.2)
  return proc


@pytest.mark.ray
def test_sigterm_on_ray_saves_the_last_round_and_exits_143(repo_root, tmp_path):
  """ray.init replaced the run's SIGTERM handler: the run exited 15 with no line and no
  checkpoint of its last finished round."""
  proc = _ray_run(repo_root, tmp_path)
  try:
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
  finally:
    proc.kill()
  assert proc.returncode == 143, stderr[-2000:]
  assert 'Traceback' not in stderr
  last = re.search(r'run.py: terminated \(SIGTERM\); saved the state of round (\d+)', stderr)
  assert last, stderr[-2000:]
  rows = (tmp_path / 'metrics.csv').read_text().splitlines()
  assert rows[-1].split(',')[0] == last[1]
  assert (tmp_path / 'checkpoints' / f'state_{last[1]}.npz').exists()


@pytest.mark.ray
def test_a_killed_drivers_cluster_is_gone_within_seconds(repo_root, tmp_path):
  """After kill -9 of a driver, Ray's dashboard and runtime_env agents lived on for
  60-120 s (reporting the raylet's death to the GCS that died with it)."""
  proc = _ray_run(repo_root, tmp_path)
  started = psutil.Process(proc.pid).children(recursive=True)
  assert any('raylet' in ' '.join(p.cmdline()) for p in started)
  proc.kill()
  proc.communicate()
  _, alive = psutil.wait_procs(started, timeout=15)
  assert not alive, [' '.join(p.cmdline())[:200] for p in alive]
