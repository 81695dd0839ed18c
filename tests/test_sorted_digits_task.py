"""The label-sorted digits task (Karimireddy, He and Jaggi 2022's non-IID partition on
scikit-learn's bundled digits): its shards, and the paper's qualitative result on it:
under the label-sorted partition Krum loses most of its accuracy while the mean does
not, and bucketing recovers most of it."""

import numpy as np
import pytest

from tff_comp import experiment
from tff_comp.tasks import sorted_digits


def test_sorted_shards_hold_one_or_two_digits_and_iid_shards_most_of_them():
  rng = np.random.default_rng(0)
  labels = rng.permutation(np.repeat(np.arange(10), 108))  # 1,080 examples, as the task's 1,078
  for partition, held in (('sorted', {1, 2}), ('iid', {7, 8, 9, 10})):
    parts = sorted_digits.shards(labels, 25, partition, rng)
    assert sorted(np.concatenate(parts)) == list(range(len(labels)))  # each example once
    assert {len(p) for p in parts} <= {43, 44}
    assert {len(np.unique(labels[p])) for p in parts} <= held, partition


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
