"""The in-process runtime gives the TFF process's results, for every registered algorithm.

Each algorithm is built once; the TFF process (on the local worker) and the in-process
runtime run the same client sequence, on clients of unequal sizes (several sizes of the
short last batch) and of equal sizes, in cohorts of changing sizes; weights, server
state and training metrics agree.
Every registered algorithm runs on the lanes engine (XLA) without falling back, with
local data shuffled (as runs have it by default); the mapped engine (the fallback) is
checked on one algorithm per aggregation kind, in stored order.
"""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tests import algorithm_cases
from tff_comp import registry
from tff_comp.runtime import inprocess, tff_process
from tff_comp.tasks import nuclear

PER_ROUND = (3, 1, 4)  # cohort sizes of the rounds compared
DATA, MODEL = algorithm_cases.DATA, algorithm_cases.MODEL

# (registered name, extra builder arguments, data, engine). Algorithms outside
# algorithm_cases.REPRESENTATIVE (on lanes: `_LANES`) and the variants whose math differs
# (objectives, MAML variants, momentum, epoch draws) run in the slow suite.
_SLOW = pytest.mark.slow
_VARIANTS = [
  ('comfedl', dict(objective='maml')),
  ('comfedl', dict(objective='da_maml')),
  ('local_scgdm', dict(objective='da_maml')),
  ('per_fedavg', dict(variant='exact')),
  ('per_fedavg', dict(variant='hf')),
  ('fednova', dict(client_momentum=0.5, local_epochs_max=3, server_momentum=0.9)),
  ('fedprox', dict(mu=0.5, local_epochs_max=2)),
  ('fedavg', dict(local_epochs=2)),
]
# Ditto's and FedNova's rounds on lanes add no kernel path SCAFFOLD's and FedAvg's do
# not take (per-client rows, example weights); mapped below, lanes under make test-slow.
_LANES = set(algorithm_cases.REPRESENTATIVE) - {'ditto', 'fednova'}
CASES = (
  [
    (name, {}, 'unequal', 'lanes')
    if name in _LANES
    else pytest.param(name, {}, 'unequal', 'lanes', marks=_SLOW)
    for name in registry.ALGORITHMS.names()
  ]
  + [(name, {}, 'unequal', 'mapped') for name in ('fedavg', 'fednova', 'ditto')]
  + [
    ('comfedl', {}, 'equal', 'lanes'),
    pytest.param('feddualavg', {}, 'equal', 'lanes', marks=_SLOW),
  ]
  + [
    pytest.param(name, extra, data, engine, marks=_SLOW)
    for name, extra in _VARIANTS
    for data in DATA
    for engine in ('lanes', 'mapped')
  ]
)


_build = algorithm_cases.build


def _close(a, b):
  for x, y in zip(tf.nest.flatten(a), tf.nest.flatten(b), strict=True):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-5)


def _case_id(case):
  name, extra, data, engine = case.values if hasattr(case, 'values') else case
  return '-'.join([name, *map(str, extra.values()), data, engine])


@pytest.mark.parametrize('name,extra,data,engine', CASES, ids=[_case_id(c) for c in CASES])
def test_inprocess_matches_the_tff_process(name, extra, data, engine):
  # The per-algorithm lanes cases shuffle local data: each runtime permutes every
  # client's epochs alike (a stateless function of seed, round, client and epoch).
  process = _build(name, extra, shuffle=(engine == 'lanes' and data == 'unequal'))
  data = DATA[data]
  # 'auto' for lanes: the test fails if the algorithm fell back to the mapped engine.
  # Two lanes for three clients a round: a lane finishes a client and takes another.
  fast = (
    inprocess.build(process, data, engine='auto', lanes=2)
    if engine == 'lanes'
    else inprocess.build(process, data, engine=engine)
  )
  if engine == 'lanes' and fast.why:  # auto maps this rule by choice (slow under XLA,
    # e.g. second-order autodiff): lanes must still give the same results.
    fast = inprocess.build(process, data, engine='lanes', lanes=2)
  if engine == 'lanes' and name != 'fedavg':
    # FedAvg's case grows the kernel (a cohort of 4 after cohorts of 3 and 1: traced and
    # compiled again); the others reserve it, traced once, the cohort of 1 padded.
    fast.reserve_cohort(max(PER_ROUND))
  slow = tff.simulation.compose_dataset_computation_with_learning_process(
    tff_process.dataset_computation_for(process, data), process
  )
  rng = np.random.default_rng(3)
  fast_state, slow_state = fast.initialize(), slow.initialize()
  for size in PER_ROUND:  # the second cohort padded in the lanes kernel
    ids = [data.client_ids[i] for i in rng.choice(5, size, replace=False)]
    fast_out, slow_out = fast.next(fast_state, ids), slow.next(slow_state, ids)
    fast_state, slow_state = fast_out.state, slow_out.state
    _close(fast_out.metrics['client_work'], slow_out.metrics['client_work'])
    if fast_out.metrics['aggregator']:  # FedNova's tau_eff, as TFF's aggregator has it
      _close(fast_out.metrics['aggregator']['tau_eff'], slow_out.metrics['aggregator']['tau_eff'])
  assert fast.engine == engine
  moved = np.abs(np.asarray(fast.get_model_weights(fast_state).trainable[0])).max()
  assert moved > 1e-3, 'the model did not move: the comparison would be vacuous'
  _close(
    fast.get_model_weights(fast_state).trainable, process.get_model_weights(slow_state).trainable
  )
  _close(fast_state.finalizer, slow_state.finalizer)
  _close(fast.get_hparams(fast_state), process.get_hparams(slow_state))


def test_cohorts_of_any_size_match_the_tff_process():
  """Cohorts of 1, 3, 7 and 10 clients in one lanes kernel sized for 10 (smaller ones
  padded with clients of no steps), shuffled, against TFF's process on the same
  cohorts (`tests/test_lanes.py` counts that kernel's compiles: one)."""
  data = algorithm_cases.TEN
  process = _build('fedavg', {}, shuffle=True)
  fast = inprocess.build(process, data, engine='lanes', lanes=3)
  fast.reserve_cohort(10)
  slow = tff.simulation.compose_dataset_computation_with_learning_process(
    tff_process.dataset_computation_for(process, data), process
  )
  rng = np.random.default_rng(5)
  fast_state, slow_state = fast.initialize(), slow.initialize()
  for size in algorithm_cases.COHORT_SIZES:
    ids = [data.client_ids[i] for i in rng.choice(10, size, replace=False)]
    fast_out, slow_out = fast.next(fast_state, ids), slow.next(slow_state, ids)
    fast_state, slow_state = fast_out.state, slow_out.state
    _close(fast_out.metrics['client_work'], slow_out.metrics['client_work'])
    assert fast_out.metrics['client_work']['num_examples'] == sum(
      int(data.create_tf_dataset_for_client(c).cardinality()) for c in ids
    )
  assert fast.capacity == 10
  _close(
    fast.get_model_weights(fast_state).trainable, process.get_model_weights(slow_state).trainable
  )


def test_model_weights_read_in_numpy_in_the_containers_they_were_set_in():
  fast = inprocess.build(_build('fedavg', {}), DATA['unequal'])
  state = fast.initialize()
  weights = fast.get_model_weights(state)
  assert isinstance(weights, tff.learning.models.ModelWeights)
  assert type(weights.trainable) is tuple
  assert all(type(w) is np.ndarray for w in weights.trainable)
  _close(weights.trainable, MODEL.initial_weights[0])
  halved = [tf.constant(w / 2) for w in MODEL.initial_weights[0]]
  state = fast.set_model_weights(
    state, tff.learning.models.ModelWeights(halved, list(weights.non_trainable))
  )
  weights = fast.get_model_weights(state)
  assert type(weights.trainable) is list and type(weights.non_trainable) is list
  _close(weights.trainable, [w / 2 for w in MODEL.initial_weights[0]])


def test_custom_aggregator_and_hand_built_processes_are_refused():
  process = registry.get_algorithm('fedavg').build(
    MODEL, client_learning_rate=0.1, model_aggregator=tff.learning.robust_aggregator(zeroing=False)
  )
  with pytest.raises(inprocess.UnsupportedError, match='TFF runtime'):
    inprocess.build(process, DATA['unequal'])
  builtin = tff.learning.algorithms.build_weighted_fed_avg(
    MODEL, tff.learning.optimizers.build_sgdm(0.1)
  )
  with pytest.raises(inprocess.UnsupportedError, match='hand-built'):
    inprocess.build(builtin, DATA['unequal'])


def test_hparams_set_between_rounds_take_effect():
  process = _build('fedavg', {})
  fast = inprocess.build(process, DATA['unequal'])
  state = fast.initialize()
  hparams = fast.get_hparams(state)
  hparams['client_work']['learning_rate'] = 0.0
  state = fast.set_hparams(state, hparams)
  out = fast.next(state, ['c0', 'c1'])
  _close(fast.get_model_weights(out.state).trainable, MODEL.initial_weights[0])


def test_device_choice_prefers_a_gpu():
  Device = collections.namedtuple('Device', 'name device_type')
  cpu, gpu = Device('/device:CPU:0', 'CPU'), Device('/device:GPU:0', 'GPU')
  assert inprocess.choose_device([cpu]) == cpu.name
  assert inprocess.choose_device([cpu, gpu]) == gpu.name
  with pytest.raises(RuntimeError):
    inprocess.choose_device([])


def test_auto_runs_a_step_with_an_svd_mapped_and_says_why():
  """XLA runs an SVD (the nuclear-norm prox of every local step) as a slow loop on a
  CPU: 'auto' picks the mapped engine for it, while 'lanes' can still be asked for."""
  task = nuclear.build_nuclear_task(dataset='IV')
  process = registry.get_algorithm('feddualavg').build(
    task.model, client_learning_rate=1e-3, regularizer=task.regularizer
  )
  auto = inprocess.build(process, task.train_data)
  assert auto.engine == 'mapped' and 'Svd' in auto.why
  assert inprocess.build(process, task.train_data, engine='lanes').engine == 'lanes'
  plain = registry.get_algorithm('feddualavg').build(
    MODEL,
    client_learning_rate=1e-3,
    regularizer=algorithm_cases.arguments('feddualavg', {})['regularizer'],
  )
  assert inprocess.build(plain, DATA['unequal']).engine == 'lanes'  # an L1 prox: lanes
