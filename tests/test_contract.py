"""An algorithm checks its contract when built, in pure TF (`ops.contract`): blocks that
do not fit fail at construction, in one line naming the link."""

import dataclasses

import pytest

from tests import algorithm_cases
from tff_comp import registry
from tff_comp.ops import algorithm as algorithm_lib
from tff_comp.ops import contract, privacy, update_aggregation


def _built(name):
  return registry.get_algorithm(name).build(
    algorithm_cases.MODEL, **algorithm_cases.arguments(name, {})
  )


@pytest.mark.parametrize('name', registry.ALGORITHMS.names())
def test_every_registered_algorithm_keeps_its_contract(name):
  contract.check(_built(name))


@pytest.mark.parametrize(
  'client, server, kind, link',
  [
    # FedDualAvg's server broadcasts the dual state; SGD starts from model weights.
    ('fedavg', 'feddualavg', None, r'the payload \(DualPayload\) against SGD'),
    ('scaffold', 'fedavg', None, r'the payload \(ModelWeights\) against ScaffoldClient'),
    # FedNova's normalized mean needs ||a_i||_1 beside the delta.
    (
      'fedavg',
      'fedavg',
      update_aggregation.NORMALIZED,
      r"aggregation 'normalized' needs .* no delta, a_norm",
    ),
    ('qfedavg', 'fednova', None, r"aggregation 'normalized' needs .* \(QUpdate\) has no a_norm"),
    # q-FedAvg's ratio step takes (delta, h), not a plain model delta.
    (
      'fedavg',
      'qfedavg',
      None,
      r'aggregated update \(tuple\) .*update_spec\(\) declares \(QUpdate\)',
    ),
    ('fednova', 'qfedavg', None, r"server_rule.step: AttributeError: .*NormalizedUpdate.* 'h'"),
  ],
)
def test_blocks_that_do_not_fit_fail_when_built(client, server, kind, link):
  a, b = _built(client), _built(server)
  with pytest.raises(contract.ContractError, match=link) as error:
    algorithm_lib.Algorithm(
      a.model, a.client_rule, b.server_rule, a.client_options, kind or b.aggregation
    )
  assert '\n' not in str(error.value)


def test_other_client_options_keep_the_checks_and_another_weighting_runs_them_again():
  """`with_client_options` skips the checks only where they cannot change: a DP mean's
  uniform weighting is checked again when the weighting changes."""
  spec = privacy.GaussianMean(1.0, 0.5, 3.0)
  dp = algorithm_cases.algorithm(
    'fedavg', {'model_aggregator': spec, 'client_weighting': 'uniform'}
  )
  seeded = dp.with_client_options(seed=7, shuffle=False, local_epochs=2)
  assert seeded == dataclasses.replace(
    dp, client_options=dataclasses.replace(dp.client_options, seed=7, shuffle=False, local_epochs=2)
  )
  with pytest.raises(ValueError, match="client_weighting='uniform'"):
    dp.with_client_options(weighting='examples')


def test_a_wrapped_rule_keeps_every_capability_flag_of_its_inner_rule():
  """`RuleWrapper` forwards each flag of `rule.CAPABILITIES`, whatever the inner rule
  sets, so a wrapper (FedNova's normalized client) never hides what its inner rule
  needs from the runtime (separate batches, the client's index, its start loss)."""
  from tff_comp.ops import rule as rule_lib

  class Plain(rule_lib.ClientRule):
    start = local_step = None  # never called

  class Flagged(Plain):
    batches_per_step = 3
    weighs_clients = True
    uses_reference_loss = True
    uses_start_loss = True
    uses_client_index = True

  for rule in (Plain, Flagged):
    inner = rule(algorithm_cases.MODEL, learning_rate=0.1)
    wrapper = rule_lib.RuleWrapper(inner)
    assert {f: getattr(wrapper, f) for f in rule_lib.CAPABILITIES} == {
      f: getattr(inner, f) for f in rule_lib.CAPABILITIES
    }
  assert [getattr(inner, f) for f in rule_lib.CAPABILITIES] == [3, True, True, True, True]
