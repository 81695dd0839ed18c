"""Every registered algorithm on one small linear-regression problem: clients of unequal
sizes (`DATA['unequal']`) and of equal sizes (`DATA['equal']`), and a builder call
that fits each algorithm (`build`)."""

import inspect

import numpy as np
import pytest
import tensorflow as tf

from tff_comp import models, registry
from tff_comp.learning_process import composer
from tff_comp.ops import regularizers
from tff_comp.run import sampling
from tff_comp.tasks import array_data

D, NUM_CLIENTS = 5, 5
MODEL = models.linear_regression((D,))


def client_data(sizes, key):
  w = np.linspace(-1, 1, D).astype(np.float32)

  def make(i):
    rng = np.random.default_rng([7, i])
    x = rng.normal(size=(sizes[i], D)).astype(np.float32) + 0.1 * i
    return x, (x @ w + 0.3 + 0.1 * rng.normal(size=sizes[i])).astype(np.float32)

  ids = [f'c{i}' for i in range(len(sizes))]
  return array_data.cached_client_data(f'inprocess-{key}', ids, (D,), tf.float32, make)


DATA = {
  'unequal': client_data([7, 12, 9, 5, 14], 'unequal'),
  'equal': client_data([8] * NUM_CLIENTS, 'equal'),
}
# Ten clients of unequal sizes, for cohorts of every size up to ten (FedAvg-like rules:
# `arguments` sizes per-client tables for NUM_CLIENTS).
TEN = client_data([7, 12, 9, 5, 14, 3, 10, 8, 11, 6], 'ten')
# Cohorts of 1, 3, 7 and 10 of TEN's clients.
COHORT_SIZES = (1, 3, 7, 10)


def arguments(name: str, extra: dict) -> dict:
  """Builder arguments for algorithm `name` on this problem, `extra` taking precedence."""
  entry = registry.get_algorithm(name)
  args = dict(client_learning_rate=0.02)
  for arg, value in (
    ('regularizer', regularizers.L1(strength=0.05)),
    ('num_clients', NUM_CLIENTS),
    ('batch_size', 3),
    ('gamma', 2.0),
    ('local_steps', 4),
  ):
    optional = inspect.signature(entry.builder).parameters.get(arg)
    if entry.accepts(arg) and not (arg == 'local_steps' and optional.default == 0):
      args[arg] = value  # local SGD's optional local_steps (0: epochs) left unset
  args.update(extra)
  return args


def algorithm(name: str, extra: dict, shuffle: bool = False):
  """The Algorithm `name` on this problem; `shuffle`: local data in a new order every
  round and epoch (seed 3), as runs have it by default."""
  built = registry.get_algorithm(name).build(MODEL, **arguments(name, extra))
  return (
    built.with_client_options(shuffle=True, seed=3)
    if shuffle
    else built.with_client_options(shuffle=False)
  )


def build(name: str, extra: dict, shuffle: bool = False):
  """The TFF process of algorithm `name` on this problem (`composer.compose`)."""
  return composer.compose(algorithm(name, extra, shuffle))


def cyclic_rounds(runtime, rounds: int):
  """`runtime`'s model weights after `rounds` rounds on `DATA['unequal']` in cyclic
  blocks of 2 (seed 3), the participation DP-FTRL's and BandMF's accounting take."""
  ids = list(DATA['unequal'].client_ids)
  sampler = sampling.ClientSampler(ids, 2, 3, sampling.Participation('cyclic'))
  state = runtime.initialize()
  for round_num in range(1, rounds + 1):
    state = runtime.next(state, list(sampler.sample(round_num).reporting)).state
  return runtime.get_model_weights(state).trainable


def stored_order(algorithm):
  """The TFF process of `algorithm` with each client's data in stored order (local data
  are shuffled by default), as TFF's own algorithms and the NumPy references read it."""
  return composer.compose(algorithm.with_client_options(shuffle=False))


# The default suite's algorithms where a test repeats for each one: one of each kind
# (plain local SGD; control variates and personal models held per client; normalized
# aggregation; a dual server state; a memory per client with second-order steps). The
# others run under `make test-slow`.
REPRESENTATIVE = ('fedavg', 'scaffold', 'ditto', 'fednova', 'feddualavg', 'local_moml')


def each_algorithm(names=None, keep=REPRESENTATIVE) -> list:
  """pytest params of `names` (default: every registered algorithm), those outside
  `keep` marked slow."""
  return [
    pytest.param(n, marks=() if n in keep else pytest.mark.slow, id=n)
    for n in (registry.ALGORITHMS.names() if names is None else names)
  ]
