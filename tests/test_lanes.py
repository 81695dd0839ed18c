"""Lockstep lanes (`runtime.inprocess.lanes`) give each client exactly `client_round.run_client`'s
output, whatever the lane count, and every algorithm's kernel compiles once for every
cohort."""

import collections
import logging
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from tests import algorithm_cases
from tff_comp import models, registry
from tff_comp.ops import client_round, sgd
from tff_comp.ops import rule as rule_lib
from tff_comp.runtime import inprocess
from tff_comp.runtime.inprocess import engines, lanes, resident_data

D = 3
MODEL = models.linear_regression((D,))
# Sizes around the batch size 4: an empty client, clients with no full batch, with
# and without a short last batch.
SIZES = [9, 0, 3, 12, 1, 7, 4, 5]


def _data():
  rng = np.random.default_rng(0)
  x = rng.normal(size=(sum(SIZES), D)).astype(np.float32)
  y = (x @ np.array([1.0, -2.0, 0.5], np.float32) + 0.1).astype(np.float32)
  return (tf.constant(x), tf.constant(y))


_Weights = collections.namedtuple('Weights', 'trainable non_trainable')  # no TFF


def _setup(momentum: float, epochs: int):
  rule = sgd.SGD(MODEL, learning_rate=0.05, momentum=momentum, proximal_strength=0.1)
  options = client_round.ClientOptions(batch_size=4, local_epochs=epochs, shuffle=False)
  payload = _Weights((tf.constant([0.3, -0.1, 0.2]), tf.constant(0.05)), ())
  hparams = {k: tf.constant(v, tf.float32) for k, v in rule.initial_hparams().items()}
  return rule, options, payload, hparams


def _expected(rule, options, payload, hparams, examples, cohort):
  offsets = np.cumsum(SIZES) - SIZES
  outs = []
  for c in cohort:
    client = tf.nest.map_structure(lambda t: t[offsets[c] : offsets[c] + SIZES[c]], examples)  # noqa: B023 (called in this iteration)
    outs.append(
      client_round.run_client(
        rule,
        payload,
        client,
        hparams,
        rule_lib.RoundContext.of(client_index=c),
        options,
        tf.constant(0),
      )
    )
  return outs


def _kernel(rule, options, examples, width, short_sizes):
  """The lanes engine's round for a cohort: full batches in lanes, the short batches of
  `short_sizes` after them (all the data give) or else each size outside, then every
  client's output."""

  def kernel(payload, hparams, offsets, counts, plans):
    states = lanes.run_batches(
      rule,
      payload,
      hparams,
      options,
      examples,
      offsets,
      counts,
      plans,
      lanes=width,
      sizes=short_sizes,
    )
    if not short_sizes:
      states = lanes.run_short_batches(
        rule, payload, hparams, options, examples, offsets, counts, plans, states
      )
    return lanes.finish_cohort(rule, payload, hparams, options, counts, plans, states)

  return kernel


def _cohort_args(rule, options, cohort):
  """(offsets, counts, plans) of `cohort`, as the in-process runtime makes them."""
  counts = tf.constant([SIZES[c] for c in cohort], tf.int32)
  offsets = tf.constant([int(np.sum(SIZES[:c])) for c in cohort], tf.int32)
  batches = client_round.plan_cohort(rule, options, counts, tf.zeros_like(counts, tf.int64), 0)
  m = len(cohort)
  context = rule_lib.RoundContext(tf.constant(cohort, tf.int32), tf.zeros([m]), tf.zeros([m]))
  return offsets, counts, client_round.ClientPlan(context, batches)


def _combinations():
  """(width, momentum, epochs, in_kernel): two by default, a width under and over the
  cohort, local work with momentum and epochs, the short batches in and out of the
  kernel; the other ten in the slow suite."""
  default = {(8, 0.5, 2, True), (3, 0.5, 2, False)}
  combinations = [
    (width, momentum, epochs, in_kernel)
    for width in (1, 3, 8)
    for momentum, epochs in ((0.0, 1), (0.5, 2))
    for in_kernel in (True, False)
  ]
  return [pytest.param(*c, marks=() if c in default else pytest.mark.slow) for c in combinations]


@pytest.mark.parametrize('width,momentum,epochs,in_kernel', _combinations())
def test_each_client_gets_run_clients_output(width, momentum, epochs, in_kernel):
  rule, options, payload, hparams = _setup(momentum, epochs)
  examples = _data()
  cohort = [3, 1, 0, 4, 2, 6, 5, 7]
  args = _cohort_args(rule, options, cohort)
  remainders = args[2].batches.remainder.numpy()
  # Short batches of sizes 1 and 3 with one epoch, 2 with two.
  short_sizes = tuple(int(r) for r in np.unique(remainders[remainders > 0]))
  assert short_sizes == ((1, 3) if epochs == 1 else (2,))
  stacked = _kernel(rule, options, examples, width, short_sizes if in_kernel else ())(
    payload, hparams, *args
  )
  for i, expected in enumerate(_expected(rule, options, payload, hparams, examples, cohort)):
    got = tf.nest.map_structure(lambda t: t[i], stacked)  # noqa: B023 (called in this iteration)
    for a, b in zip(tf.nest.flatten(got), tf.nest.flatten(expected), strict=True):
      np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-6)
  # The empty client (index 1 in the data, position 1 here) took no step, weighs 0.
  assert float(stacked.stats['num_steps'][1]) == 0.0
  assert float(stacked.weight[1]) == 0.0


def test_the_kernels_width_takes_the_fewest_lane_steps():
  """Ten clients of 12 full batches: 8 lanes take two passes (24 steps, the second with
  6 lanes idle), 10 lanes one (12 steps), so a kernel for 10 takes 10 lanes unless the
  lanes are set or its first cohort is smaller; where one large client sets the
  makespan at any width, the fewer lanes."""
  assert (lanes.makespan(np.full(10, 12), 8), lanes.makespan(np.full(10, 12), 10)) == (24, 12)
  assert lanes.makespan(np.array([100, *[5] * 9]), 8) == 100
  assert lanes.lane_width(np.full(40, 12), 10, 8) == 10
  assert lanes.lane_width(np.full(40, 12), 4, 8) == 4
  assert lanes.lane_width(np.array([100] * 5 + [1] * 35), 10, 8) == 8
  # 24 equal clients: 8 lanes (3 passes) and 12 (2 passes) tie; 16 would idle 8 lanes.
  assert lanes.lane_width(np.full(40, 12), 24, 8) == 8
  x = np.random.default_rng(0).normal(size=(10 * 48, D)).astype(np.float32)
  data = resident_data.ResidentData(
    (x, x[:, 0]),
    np.full(10, 48, np.int32),
    tuple(str(i) for i in range(10)),
    'CPU',
    with_keys=False,
  )
  algorithm = algorithm_cases.algorithm('fedavg', {})
  assert engines.LanesEngine(algorithm, data, lanes=8).width(10) == 8  # lanes as given
  full = engines.LanesEngine(algorithm, data, lanes=8, full_batches=np.full(10, 16))
  full.note_cohort(10)
  assert full.width(10) == 10
  # A first cohort of 7 (dropout) in a kernel for 10: most rounds would idle 2 more lanes.
  dropped = engines.LanesEngine(algorithm, data, lanes=8, full_batches=np.full(10, 16))
  dropped.note_cohort(7)
  assert dropped.width(10) == 8


def test_a_cohort_is_dealt_to_threads_in_shares_of_equal_lane_steps():
  """`kernel_threads`: each share of a cohort is its clients dealt back and forth by
  full batches, so each share's lane-steps are about equal."""
  full = np.array([3, 10, 8, 4, 9, 6, 7, 5])
  shares = lanes.shares(tf.constant(full), 2).numpy()
  assert sorted(shares.ravel()) == list(range(8))
  assert full[shares].sum(axis=1).tolist() == [26, 26]  # 10+7+6+3, 9+8+5+4


# Ditto's per-client rows split across threads: make test-slow.
@pytest.mark.parametrize('name', ['fedavg', pytest.param('ditto', marks=pytest.mark.slow)])
def test_a_cohort_split_across_threads_gives_each_client_its_result(name):
  """A cohort run as kernels side by side, one a share of its clients: every client's
  result and the round's are a single kernel's to the bit (cohorts of 1 to 10 clients,
  3 threads: shares padded)."""
  data = algorithm_cases.TEN
  results = []
  for threads in (1, 3):
    runtime = inprocess.build(
      algorithm_cases.algorithm(name, {}, shuffle=True),
      data,
      engine='lanes',
      lanes=2,
      kernel_threads=threads,
    )
    runtime.reserve_cohort(10)
    assert runtime.engine_impl.parts(10) == threads
    state, rng, metrics = runtime.initialize(), np.random.default_rng(5), []
    for size in algorithm_cases.COHORT_SIZES:
      cohort = [data.client_ids[i] for i in rng.choice(10, size, replace=False)]
      output = runtime.next(state, cohort)
      state = output.state
      metrics.append(output.metrics)
    results.append((tf.nest.map_structure(np.asarray, state), metrics))
  tf.nest.map_structure(np.testing.assert_array_equal, *results)


def test_the_lanes_kernels_derive_the_cohorts_plans_and_shares(monkeypatch):
  """A lanes round's graph keeps the cohort's plans (the shuffle seeds' mixing) and
  shares (their sort by full batches) inside its XLA kernels, not as TensorFlow ops
  before them; FedAvg's results are the mapped engine's (tests/test_inprocess.py). A
  kernel vectorizes the rule's step once, for its full batches and every short size."""
  stepped = []
  vectorize = lanes._step_all
  monkeypatch.setattr(lanes, '_step_all', lambda *a, **k: stepped.append(1) or vectorize(*a, **k))
  data = algorithm_cases.TEN
  runtime = inprocess.build(
    algorithm_cases.algorithm('fedavg', {}, shuffle=True),
    data,
    engine='lanes',
    lanes=2,
    kernel_threads=2,
  )
  runtime.next(runtime.initialize(), list(data.client_ids[:7]))
  (concrete,) = runtime._round_fn._concrete.values()
  graph = concrete.graph.as_graph_def()
  outside = {node.op for node in graph.node}
  inside = {
    node.op
    for f in graph.library.function
    if f.signature.name.startswith('__inference__local_steps')
    for node in f.node_def
  }
  assert 'StatefulPartitionedCall' in outside  # the kernels, called side by side
  assert not {'BitwiseXor', 'TopKV2', 'ResourceGather'} & outside, outside
  assert {'BitwiseXor', 'TopKV2'} <= inside
  kernels = {f.signature.name for f in graph.library.function if '_local_steps' in f.signature.name}
  assert len(runtime._engines['lanes']._kernel_sizes) >= 2
  assert len(stepped) == len(kernels), (stepped, kernels)


def _compiles(repo_root, *scripts: str) -> list[tuple[str, list[tuple[str, str]]]]:
  """(stdout, [(kernel, compiles so far)] from XLA's log) of each of `scripts`, run one
  after another in one fresh Python (one TensorFlow import)."""
  marker = '@@ next script'
  joined = f'\nprint({marker!r}, flush=True); print({marker!r}, file=sys.stderr, flush=True)\n'
  out = subprocess.run(
    [sys.executable, '-c', 'import sys\n' + joined.join(scripts)],
    capture_output=True,
    text=True,
    timeout=600,
    cwd=repo_root,
    stdin=subprocess.DEVNULL,
    env=dict(
      os.environ,
      PYTHONPATH=str(repo_root),
      TF_CPP_MIN_LOG_LEVEL='0',
      TF_CPP_VMODULE='device_compilation_profiler=1',
    ),
  )
  assert out.returncode == 0, out.stderr[-3000:]
  pattern = r'Compiled (__inference__local_steps_\d+) (\d+) times'
  return [
    (stdout, re.findall(pattern, stderr))
    for stdout, stderr in zip(out.stdout.split(marker), out.stderr.split(marker), strict=True)
  ]


# Every registered algorithm, rounds of changing cohorts, XLA's own count of compiles.
_COMPILES = """
import numpy as np
from tests import algorithm_cases
from tff_comp import registry
from tff_comp.runtime import inprocess
data = algorithm_cases.DATA['unequal']
for name in registry.ALGORITHMS.names():
  process = inprocess.build(algorithm_cases.algorithm(name, {}, shuffle=True), data, lanes=2)
  process.reserve_cohort(5)
  state, rng = process.initialize(), np.random.default_rng(1)
  for size in (3, 1, 5, 2):
    cohort = [data.client_ids[i] for i in rng.choice(5, size, replace=False)]
    state = process.next(state, cohort).state
  assert process.engine == 'lanes', name
"""


@pytest.mark.slow
def test_every_algorithm_compiles_once_for_every_cohort(repo_root):
  """Cohorts of changing members and sizes (up to the reserved capacity). XLA bakes a
  tensor used as a slice index (`t[i]`) into the program as a constant,
  so a kernel or rule indexing by client compiled again for every new cohort (seconds
  a round; Ditto's row read did). XLA's log counts the compiles of each kernel."""
  [(_, counts)] = _compiles(repo_root, _COMPILES)
  kernels = {name for name, _ in counts}
  assert len(kernels) == len(registry.ALGORITHMS.names()), counts
  assert all(int(n) == 1 for _, n in counts), [c for c in counts if int(c[1]) > 1]


_COHORT_SIZES = """
import numpy as np
from tests import algorithm_cases
from tff_comp.runtime import inprocess
data = algorithm_cases.TEN
process = inprocess.build(algorithm_cases.algorithm('fedavg', {}, shuffle=True), data,
                          engine='lanes', lanes=3)
process.reserve_cohort(10)
state, rng = process.initialize(), np.random.default_rng(5)
for size in algorithm_cases.COHORT_SIZES:
  cohort = [data.client_ids[i] for i in rng.choice(10, size, replace=False)]
  state = process.next(state, cohort).state
"""


def test_cohorts_of_1_3_7_and_10_clients_compile_once(compiled_default):
  """A new cohort size does not compile the kernel again (parity on the same cohorts:
  tests/test_inprocess.py)."""
  _, counts = compiled_default[0]
  assert [int(n) for _, n in counts] == [1], counts


# A Keras CNN on lanes (its convolutions as per-tap matmuls), cohorts of changing size.
_CNN = """
from tests import test_keras_models as k
from tff_comp import keras_models
from tff_comp.algorithms import fedavg
from tff_comp.runtime import inprocess
model = keras_models.from_keras(k._cnn(), k.LOSS, k._spec('cnn'))
process = inprocess.build(fedavg.build_fedavg(model, client_learning_rate=0.1,
                                              batch_size=k.BATCH), k._data('cnn'),
                          engine='lanes', lanes=2)
process.reserve_cohort(4)
state = process.initialize()
for cohort in (['a', 'b', 'c'], ['d'], ['a', 'b', 'c', 'd'], ['c', 'a']):
  state = process.next(state, cohort).state
"""


@pytest.mark.slow
def test_a_keras_cnn_compiles_once_for_every_cohort(repo_root):
  """Lanes vectorize a Keras CNN's convolutions as per-tap matmuls (`ops.vectorizable`), with
  static shapes: one compile for cohorts of 3, 1, 4 and 2 clients (parity:
  tests/test_keras_models.py)."""
  [(_, counts)] = _compiles(repo_root, _CNN)
  assert [int(n) for _, n in counts] == [1], counts


# Rules with second-order autodiff on lanes, over cohorts of changing members, then as
# 'auto' builds them (with enough client rounds to repay compiling).
_SECOND_ORDER = """
import numpy as np
from tests import algorithm_cases
from tff_comp.runtime import inprocess
data = algorithm_cases.DATA['unequal']
for name, options in [('per_fedavg', dict(variant='exact')), ('comfedl', dict(objective='maml'))]:
  lanes = inprocess.build(algorithm_cases.build(name, options), data, lanes=2, engine='lanes')
  lanes.reserve_cohort(3)
  state, rng = lanes.initialize(), np.random.default_rng(1)
  for _ in range(3):
    cohort = [data.client_ids[i] for i in rng.choice(5, 3, replace=False)]
    state = lanes.next(state, cohort).state
  auto = inprocess.build(algorithm_cases.build(name, options), data, client_rounds=10**6)
  print(name, auto.engine)
"""


@pytest.fixture(scope='module')
def compiled_default(repo_root):
  """`_compiles` of the default suite's two scripts, in one interpreter."""
  return _compiles(repo_root, _COHORT_SIZES, _SECOND_ORDER)


def test_a_clients_row_of_per_client_tables_vectorizes_across_lanes(caplog):
  """Ditto's (and AFL's, TR-MAML's, Local-MOML's) client writes its row of the [N]
  tables with a select, which vectorizes across lanes: a scatter had no vectorized form
  and ran as a loop over the cohort's clients, saying so in TensorFlow's log."""
  logger = logging.getLogger('tensorflow')
  logger.addHandler(caplog.handler)
  try:
    data = algorithm_cases.DATA['unequal']
    process = inprocess.build(algorithm_cases.algorithm('ditto', {}), data, engine='lanes')
    process.next(process.initialize(), list(data.client_ids))
  finally:
    logger.removeHandler(caplog.handler)
  assert not [r for r in caplog.records if 'while_loop for converting' in r.getMessage()]


def test_second_order_rules_compile_once_so_auto_keeps_them_on_lanes(compiled_default):
  """A gradient of a gradient under `tf.vectorized_map` compiles once for every cohort:
  the model's functions are traced inline in the kernel (`ops.model_ops.batch_loss`; a
  reused trace for batches of unknown size made XLA compile every round, about 1 s on
  sinewave). So 'auto' runs such rules on lanes (Per-FedAvg's exact variant on sinewave:
  0.0064 s a round against 0.022 mapped, measured 2026-11-27)."""
  stdout, counts = compiled_default[1]
  assert len({kernel for kernel, _ in counts}) == 2, counts
  assert all(int(n) == 1 for _, n in counts), counts
  for name in ('per_fedavg', 'comfedl'):
    assert f'{name} lanes' in stdout, stdout
