"""Aggregator chains on the in-process runtime: a round with a chain equals the chain
applied by hand to the clients' own outputs (their updates from the same state), on
the lanes and mapped engines alike; persistent rows (error feedback) live in the state
and in checkpoints; FedNova's normalized deltas go through a chain with its tau_eff
exact; a chain that a runtime cannot hold yet is refused in one line."""

import dataclasses

import numpy as np
import pytest
import tensorflow as tf

from tests import algorithm_cases
from tff_comp.ops import update_aggregation
import tff_comp.ops.aggregators as agg
from tff_comp.runtime import choice, inprocess

DATA, MODEL = algorithm_cases.DATA['unequal'], algorithm_cases.MODEL
IDS = list(DATA.client_ids)
COHORT = [IDS[3], IDS[0], IDS[4], IDS[1]]  # positions not the population's indices


@dataclasses.dataclass
class _Scale(agg.Stage):
  """A stage as a plugin may write it: a dataclass, so unhashable (eq, no hash), its
  encodes compiled (`runtime.inprocess.stages` binds the chain to its program)."""

  factor: float = 0.5
  worth_compiling = True

  def encode(self, state, x, weights, rows, seeds):
    return agg.base.Encoded(x * self.factor, weights, rows, {})


CHAINS = {
  'clip_median': agg.Chain((agg.Clip(0.5),), agg.Median()),
  'krum_under_sign_flip': agg.Chain((agg.SignFlip(0.5),), agg.Krum(1, 2)),
  'nnm_median': agg.Chain((), agg.Median(), agg.NearestNeighbourMixing(1)),
  'momentum_median': agg.Chain((agg.WorkerMomentum(0.5),), agg.Median()),
  'ef_top_k': agg.Chain((agg.ErrorFeedback(agg.TopK(0.5)),), agg.Mean()),
  'rotate_quantize': agg.Chain((agg.Rotate(), agg.Quantize(4)), agg.Mean()),
  'secure_sum': agg.Chain((agg.Clip(1.0),), agg.SecureSum(2.0, 16)),
  'dataclass_stage': agg.Chain((_Scale(),), agg.Mean()),
}


def _fedavg(chain):
  extra = dict(client_learning_rate=0.05, model_aggregator=chain)
  if chain is not None and not chain.weighted:
    extra['client_weighting'] = 'uniform'
  return algorithm_cases.algorithm('fedavg', extra, shuffle=True)


def _by_hand(runtime, chain, state, cohort, round_num):
  """The round's model update with `chain` applied to the clients' outputs by hand:
  their deltas (the chain-free runtime's `client_outputs` from the same state), flattened,
  through `Chain.aggregate` with the seeds a run derives from (seed, round, client)."""
  plain = inprocess.build(_fedavg(None), DATA, engine='mapped')
  payload = plain.algorithm.server_rule.payload(state.finalizer, state.global_model_weights)
  indices = [IDS.index(c) for c in cohort]
  outputs = plain.client_outputs(
    payload, state.client_work.hparams, cohort, [1.0] * len(cohort), indices, round_num
  )
  x = np.concatenate([np.reshape(d, (len(cohort), -1)) for d in outputs.update], 1)
  seed = runtime.algorithm.client_options.seed
  rows = (
    np.asarray(state.aggregator.rows)[indices]
    if chain.row_size
    else np.zeros((len(cohort), 0), np.float32)
  )
  update, new_rows, _, _ = chain.aggregate(
    state.aggregator.chain,
    tf.constant(x),
    tf.constant(outputs.weight),
    tf.constant(rows),
    agg.base.client_seeds(seed, round_num, tf.constant(indices)),
    agg.base.round_seed(seed, round_num),
  )
  return np.asarray(update), np.asarray(new_rows), indices


# Every chain mapped, and one robust and one stateful chain on lanes (the kernel is the
# clients'); by default a combiner of rows, a secure sum, persistent rows on lanes, a
# pre-aggregation and worker momentum.
_DEFAULT = {
  ('mapped', 'clip_median'),
  ('mapped', 'secure_sum'),
  ('lanes', 'ef_top_k'),
  ('mapped', 'nnm_median'),  # a pre-aggregation at the round's end
  ('mapped', 'momentum_median'),  # rows kept in the state, across rounds
  # Encodes compiled by XLA (stages.RoundStages): stochastic rounding, a plugin's stage.
  ('lanes', 'rotate_quantize'),
  ('lanes', 'dataclass_stage'),
}


@pytest.mark.parametrize(
  'engine,name',
  [
    pytest.param(engine, name, marks=() if (engine, name) in _DEFAULT else pytest.mark.slow)
    for engine, names in (
      ('mapped', sorted(CHAINS)),
      ('lanes', ('clip_median', 'ef_top_k', 'rotate_quantize', 'dataclass_stage')),
    )
    for name in names
  ],
)
def test_a_round_with_a_chain_is_the_chain_on_the_clients_own_updates(name, engine):
  algorithm = _fedavg(CHAINS[name])
  chain = algorithm.model_chain
  runtime, _ = choice.runner_for(algorithm, DATA, 'inprocess', engine=engine)
  state = runtime.initialize()
  for round_num in range(3):  # the rows and states carried between rounds
    want, rows, indices = _by_hand(runtime, chain, state, COHORT, round_num)
    before = np.concatenate([np.ravel(w) for w in runtime.get_model_weights(state).trainable])
    state = runtime.next(state, COHORT).state
    after = np.concatenate([np.ravel(w) for w in runtime.get_model_weights(state).trainable])
    # Updates are w_r - w_K, a pseudo-gradient the server SGD (rate 1) subtracts.
    np.testing.assert_allclose(before - after, want, rtol=2e-4, atol=2e-6)
    if chain.row_size:
      np.testing.assert_allclose(np.asarray(state.aggregator.rows)[indices], rows, atol=1e-6)
      assert np.abs(rows).max() > 0  # the residuals are kept
    assert abs(want).max() > 1e-4


@pytest.mark.parametrize(
  'name, compiled',
  [
    ('clip_median', False),
    ('ef_top_k', False),
    ('momentum_median', False),
    ('krum_under_sign_flip', False),  # an attack's draws: TensorFlow's
    ('rotate_quantize', True),
    ('dataclass_stage', True),
  ],
)
def test_only_encodes_of_many_ops_a_row_are_compiled(name, compiled):
  """Clipping, top-k and momentum run faster as graph ops than as an XLA program, the
  rotation and quantization's draws slower (docs/speed.md, part 9)."""
  runtime = inprocess.build(_fedavg(CHAINS[name]), DATA, engine='lanes')
  assert runtime.stages.encodes_compiled == compiled


def test_fednova_normalizes_before_the_chain_and_keeps_tau_eff_exact():
  chain = agg.Chain((), agg.Median())
  nova = algorithm_cases.algorithm(
    'fednova', dict(model_aggregator=chain, client_weighting='uniform')
  )
  assert nova.aggregation == update_aggregation.NORMALIZED
  runtime, _ = choice.runner_for(nova, DATA, 'inprocess', engine='mapped')
  output = runtime.next(runtime.initialize(), COHORT)
  assert float(output.metrics['aggregator']['tau_eff']) > 1  # FedNova's, beside the chain


def test_robust_combiners_need_uniform_client_weighting():
  with pytest.raises(ValueError, match='robust combiner.*uniform'):
    algorithm_cases.algorithm('fedavg', dict(model_aggregator=agg.Chain((), agg.Median())))
