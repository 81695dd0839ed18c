"""Label flipping (`tff_comp.poisoning`, --attack=label_flip): against NumPy on the
clients' arrays, the attackers' draw, its count, the refusal, and a run that trains on
the flipped labels on the in-process runtime and TFF's."""

import collections
import csv

import numpy as np
import pytest
import tensorflow_federated as tff

from tff_comp import data, experiment, poisoning, registry
from tff_comp.run import callbacks, sampling
from tff_comp.settings import ConfigError

CLASSES = 10


def _client_data(clients: int = 12, examples: int = 15, seed: int = 3):
  """Clients of random (x, y) examples, y in [0, CLASSES), as NumPy arrays and a
  ClientData."""
  rng = np.random.default_rng(seed)
  arrays = {
    f'c{i}': (
      rng.normal(size=(examples, 4)).astype(np.float32),
      rng.integers(0, CLASSES, examples, dtype=np.int32),
    )
    for i in range(clients)
  }
  return arrays, tff.simulation.datasets.TestClientData(arrays)


def test_an_attackers_labels_are_flipped_and_the_others_kept():
  arrays, client_data = _client_data()
  flipped = data.client_arrays(poisoning.flipped(client_data, CLASSES, 0.5, seed=7))
  bad = poisoning.attackers(list(arrays), 0.5, seed=7)
  assert 0 < len(bad) < len(arrays)  # both kinds present
  start = 0
  for cid, count in zip(flipped.client_ids, flipped.counts):
    x, y = arrays[cid]
    got_x, got_y = (part[start : start + count] for part in flipped.examples)
    np.testing.assert_array_equal(got_x, x)
    np.testing.assert_array_equal(got_y, CLASSES - 1 - y if cid in bad else y, err_msg=cid)
    start += count


def test_the_attackers_are_a_fraction_of_the_clients_fixed_by_the_data_seed():
  ids = [f'writer_{i}' for i in range(2000)]
  bad = poisoning.attackers(ids, 0.25, seed=1)
  assert abs(len(bad) - 500) < 4 * np.sqrt(2000 * 0.25 * 0.75)  # binomial, 4 sigma
  assert poisoning.attackers(ids, 0.25, seed=1) == bad
  assert len(bad ^ poisoning.attackers(ids, 0.25, seed=2)) > 300  # another draw
  assert not poisoning.attackers(ids, 0.0, seed=1)
  assert len(poisoning.attackers(ids, 1.0, seed=1)) == 2000


def test_tffs_dataset_computation_reads_the_flipped_labels():
  """TFF's runtime reads clients through the ClientData's dataset computation."""
  arrays, client_data = _client_data(clients=4)
  flipped = poisoning.flipped(client_data, CLASSES, 1.0, seed=0)
  dataset = flipped.dataset_computation('c2')
  np.testing.assert_array_equal([y for _, y in dataset], CLASSES - 1 - arrays['c2'][1])


def test_the_round_counts_its_reporting_attackers():
  counter = callbacks.Poisoned(frozenset({'a', 'c', 'e'}))
  metrics = collections.OrderedDict()
  counter.before_round(
    None, 1, sampling.RoundClients(('a', 'b', 'c', 'd', 'e'), ('a', 'b', 'c'), None)
  )
  counter.after_round(None, 1, metrics)
  assert metrics == {'participation/poisoned': 2}


def test_a_task_without_class_labels_is_refused_in_one_line():
  config = experiment.ExperimentConfig.of(
    algorithm='fedavg', task='lasso', rounds=1, attack='label_flip'
  )
  with pytest.raises(ConfigError) as error:
    experiment.prepare(config)
  assert str(error.value) == (
    "task 'lasso': --attack=label_flip flips class labels, but its labels are float32,"
    ' not integer classes.'
  )


def _accuracy(run_dir):
  rows = list(csv.DictReader(open(run_dir / 'metrics.csv', encoding='utf-8')))
  return rows, float(rows[-1]['eval/test_accuracy'])


@pytest.mark.parametrize('runtime', ['inprocess', 'tff'])
def test_a_run_trains_on_the_flipped_labels(tmp_path, runtime):
  """Every client flipped: the model learns y -> C - 1 - y, so its accuracy on the true
  labels falls far below the clean run's; a third flipped: each round counts the
  attackers among its clients."""
  common = dict(rounds=8, eval_period=8, clients_per_round=10, runtime=runtime)
  for fraction, name in ((0.0, 'clean'), (1.0, 'flipped')):
    experiment.train(
      'fedavg',
      'synthetic',
      show_progress=False,
      output_dir=str(tmp_path / name),
      attack='label_flip',
      attack_fraction=fraction,
      **common,
    )
  _, clean = _accuracy(tmp_path / 'clean')
  rows, flipped = _accuracy(tmp_path / 'flipped')
  assert clean > 0.4 and flipped < clean / 3, (clean, flipped)
  assert {r['participation/poisoned'] for r in rows[1:]} == {'10'}


class _Cohorts(callbacks.Callback):
  def __init__(self):
    self.reporting = []

  def before_round(self, loop, round_num, clients):
    self.reporting.append(clients.reporting)


def test_each_round_counts_the_attackers_among_its_reporting_clients(tmp_path):
  cohorts = _Cohorts()
  experiment.train(
    'fedavg',
    'synthetic',
    show_progress=False,
    callbacks=[cohorts],
    output_dir=str(tmp_path),
    rounds=6,
    clients_per_round=5,
    attack='label_flip',
    attack_fraction=0.3,
    data_seed=4,
    seed=9,
  )
  # The clients counted are the clients whose labels the run trained on flipped (the
  # run's seed is another: a flip drawn by it, counted by the data seed, agreed on 2 of
  # 11 clients, #75).
  clean = registry.get_task('synthetic').builder(seed=4).train_data
  run = experiment.prepare(
    experiment.ExperimentConfig.of(
      algorithm='fedavg',
      task='synthetic',
      output_dir=str(tmp_path / 'prepared'),
      attack='label_flip',
      attack_fraction=0.3,
      data_seed=4,
      seed=9,
    )
  ).task.train_data

  def labels(client_data, cid):
    return np.array([np.asarray(y) for _, y in client_data.create_tf_dataset_for_client(cid)])

  bad = {
    cid for cid in clean.client_ids if not np.array_equal(labels(clean, cid), labels(run, cid))
  }
  assert 0 < len(bad) < len(clean.client_ids)
  rows = list(csv.DictReader(open(tmp_path / 'metrics.csv', encoding='utf-8')))[1:]
  counts = [int(r['participation/poisoned']) for r in rows]
  assert counts == [len(set(c) & bad) for c in cohorts.reporting]
  assert sum(counts) > 0
  assert len(set(counts)) > 1, counts  # cohorts differ in their attackers
