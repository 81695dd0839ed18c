"""Hyperparameters set on a built process act exactly as if the process had been built
with them (reproduce.py builds once and sets a grid's rates through the hparams)."""

import numpy as np
import pytest
import tensorflow as tf

from tests import algorithm_cases
from tff_comp import registry, server_optimizers
from tff_comp.runtime import inprocess

# (algorithm, builder arguments of the built process, arguments set later besides every
# positive float option x 1.5): every algorithm, plus the options whose math only runs
# in a variant (an objective, a MAML variant) or from zero (FedNova's local solvers).
# Local-MOML's beta lies in (0, 1]: from 0.5 (its 0.9 x 1.5 would leave it).
_BASES = {'local_moml': dict(beta=0.5)}
CASES = [(name, _BASES.get(name, {}), {}) for name in registry.ALGORITHMS.names()] + [
  ('fednova', {}, dict(mu=0.1)),
  ('fednova', {}, dict(client_momentum=0.5)),
  ('comfedl', dict(objective='maml'), {}),
  ('local_scgdm', dict(objective='da_maml'), {}),
  ('per_fedavg', dict(variant='hf'), {}),
  ('ditto', dict(personal_learning_rate=0.01), {}),
]
# By default, the algorithms of each kind of state (algorithm_cases.REPRESENTATIVE but
# FedNova, whose options are FedAvg's and a proximal term's) at their own options.
_DEFAULT = set(algorithm_cases.REPRESENTATIVE) - {'fednova'}


def _floats(name: str, args: dict) -> dict[str, float]:
  """The algorithm's float options with positive values in `args` (or by default)."""
  values = {}
  for h in registry.get_algorithm(name).hparams:
    value = args.get(h.name, h.default)
    if h.type is float and isinstance(value, float) and value > 0:
      values[h.name] = value
  return values


def _run(process, state, rounds=2):
  data = algorithm_cases.DATA['unequal']
  for r in range(rounds):
    state = process.next(state, data.client_ids[r : r + 3]).state
  return state


@pytest.mark.parametrize(
  'name,base,later',
  [
    pytest.param(
      *c,
      id='-'.join([c[0], *map(str, c[1].values()), *c[2]]),
      marks=() if c[0] in _DEFAULT and c == (c[0], _BASES.get(c[0], {}), {}) else pytest.mark.slow,
    )
    for c in CASES
  ],
)
def test_set_hparams_then_rounds_equals_building_with_them(name, base, later):
  base_args = algorithm_cases.arguments(name, base)
  changed = dict(base, **{k: v * 1.5 for k, v in _floats(name, base_args).items()}, **later)
  data = algorithm_cases.DATA['unequal']
  # Mapped: hyperparameters' semantics, not engines (lanes compiled a kernel a build).
  built = inprocess.build(algorithm_cases.build(name, changed), data, engine='mapped')
  reference = built.initialize()
  target = built.get_hparams(reference)
  process = inprocess.build(algorithm_cases.build(name, base), data, engine='mapped')
  state = process.initialize()
  assert not all(
    np.array_equal(a, b)
    for a, b in zip(
      tf.nest.flatten(target), tf.nest.flatten(process.get_hparams(state)), strict=True
    )
  )
  state = _run(process, process.set_hparams(state, target))
  reference = _run(built, reference)
  for a, b in zip(tf.nest.flatten(reference), tf.nest.flatten(state), strict=True):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)


def test_a_rate_set_later_is_checked_as_at_build():
  process = inprocess.build(
    algorithm_cases.build('local_scgdm', {}), algorithm_cases.DATA['unequal']
  )
  state = process.initialize()
  hparams = process.get_hparams(state)
  hparams['client_work']['learning_rate'] = 2.0  # momentum_rate x eta = 2 > 1
  with pytest.raises(ValueError, match='momentum_rate x client_learning_rate must be <= 1'):
    process.set_hparams(state, hparams)
  with pytest.raises(ValueError, match='momentum_rate x client_learning_rate must be <= 1'):
    algorithm_cases.build('local_scgdm', dict(client_learning_rate=2.0))


def test_fednova_momentum_and_mu_set_later_are_refused_as_at_build():
  """FedNova's ||a||_1 has a closed form for momentum or the proximal term, not both:
  the invariant lives in the rule, so setting both later is refused too."""
  process = inprocess.build(
    algorithm_cases.build('fednova', dict(client_momentum=0.5)), algorithm_cases.DATA['unequal']
  )
  state = process.initialize()
  hparams = process.get_hparams(state)
  hparams['client_work']['proximal_strength'] = 0.1
  with pytest.raises(ValueError, match='choose one local solver'):
    process.set_hparams(state, hparams)
  with pytest.raises(ValueError, match='choose one local solver'):
    algorithm_cases.build('fednova', dict(client_momentum=0.5, mu=0.1))


@pytest.mark.parametrize('optimizer', ['sgdm', 'adam'])
def test_hparams_read_and_set_back_leave_the_rounds_unchanged(optimizer):
  """What a grid does before each trial (`callbacks.set_learning_rates`): TFF's SGDM
  keeps its momentum as a Python float, which came back as float64 and broke its float32
  step (a grid with --server_optimizer=sgdm failed with a TypeError)."""
  server = server_optimizers.build(optimizer, 1.0, beta_1=0.9, beta_2=0.99, epsilon=1e-3)
  process = inprocess.build(
    algorithm_cases.build('fedavg', dict(server_optimizer=server)),
    algorithm_cases.DATA['unequal'],
    engine='mapped',
  )
  state = process.initialize()
  again = _run(process, process.set_hparams(state, process.get_hparams(state)))
  for a, b in zip(tf.nest.flatten(_run(process, state)), tf.nest.flatten(again), strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
