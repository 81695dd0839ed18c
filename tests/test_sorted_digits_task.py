"""The label-sorted digits task (Karimireddy, He and Jaggi 2022's non-IID partition on
scikit-learn's bundled digits): its shards, and the paper's qualitative result on it:
under the label-sorted partition Krum loses most of its accuracy while the mean does
not, and bucketing recovers most of it."""

import numpy as np
import pytest

from tff_comp import experiment, registry
from tff_comp.tasks import partitions


def test_sorted_shards_hold_one_or_two_digits_and_iid_shards_most_of_them():
  rng = np.random.default_rng(0)
  labels = rng.permutation(np.repeat(np.arange(10), 108))  # 1,080 examples, as the task's 1,078
  for partition, held in (('sorted', {1, 2}), ('iid', {7, 8, 9, 10})):
    parts = partitions.shards(labels, 25, partition, rng)
    assert sorted(np.concatenate(parts)) == list(range(len(labels)))  # each example once
    assert {len(p) for p in parts} <= {43, 44}
    assert {len(np.unique(labels[p])) for p in parts} <= held, partition


def test_dirichlets_alpha_is_the_heterogeneity_knob():
  """Dirichlet(alpha) label proportions: a small alpha leaves a client few digits, a
  large one nearly all ten; every example once, no client empty, at any alpha."""
  labels = np.random.default_rng(0).permutation(np.repeat(np.arange(10), 108))
  held = {}
  for alpha in (0.05, 1.0, 100.0):
    parts = partitions.dirichlet(labels, 25, alpha, np.random.default_rng(1))
    assert sorted(np.concatenate(parts)) == list(range(len(labels)))
    assert min(len(p) for p in parts) >= 1
    # digits holding at least 5% of a client's examples, averaged over clients
    held[alpha] = np.mean(
      [np.sum(np.bincount(labels[p], minlength=10) >= 0.05 * len(p)) for p in parts]
    )
  assert held[0.05] < 2.5 < held[1.0] < 8 < held[100.0], held


def test_the_dirichlet_partition_reaches_the_task():
  build = registry.get_task('sorted_digits').builder
  task = build(partition='dirichlet', alpha=0.1)
  sizes = [
    len(list(task.train_data.create_tf_dataset_for_client(c))) for c in task.train_data.client_ids
  ]
  assert len(sizes) == 25 and sum(sizes) == 1078 and min(sizes) >= 1
  assert max(sizes) > 2 * 44  # unequal, where the shards hold 43 or 44
  with pytest.raises(ValueError, match='alpha'):
    build(partition='dirichlet', alpha=0.0)


def test_the_task_learns_and_refuses_an_unknown_partition(tmp_path):
  metrics = experiment.train(
    'fedavg',
    'sorted_digits',
    rounds=30,
    eval_period=30,
    show_progress=False,
    output_dir=str(tmp_path / 'run'),
  )
  assert metrics['eval/test_accuracy'] > 0.6, metrics  # chance: 0.1
  with pytest.raises(experiment.ConfigError, match='partition'):
    experiment.train(
      'fedavg',
      'sorted_digits',
      rounds=1,
      sorted_digits_partition='by_writer',
      output_dir=str(tmp_path / 'bad'),
    )


@pytest.mark.slow
def test_label_sorting_breaks_krum_and_bucketing_mends_it(tmp_path):
  def accuracy(partition: str, **aggregation) -> float:
    return experiment.train(
      'fedavg',
      'sorted_digits',
      rounds=200,
      eval_period=200,
      show_progress=False,
      sorted_digits_partition=partition,
      output_dir=str(tmp_path / f'{partition}{len(aggregation)}'),
      **aggregation,
    )['eval/test_accuracy']

  krum = dict(aggregator='krum', byzantine_clients=5)
  bucketed = dict(krum, pre_aggregation='bucketing', bucket_size=2)
  assert accuracy('sorted') > 0.85 and accuracy('iid', **krum) > 0.8
  sorted_krum = accuracy('sorted', **krum)
  assert sorted_krum < 0.4
  assert accuracy('sorted', **bucketed) > sorted_krum + 0.3
