"""stackoverflow_tag: TFF's files read offline into TFF's own preprocessing, the
multi-label metrics against Keras's, the synthetic source's shapes."""

import collections
import json
import pathlib

import numpy as np
import pytest
from scipy import sparse
import tensorflow as tf

from tff_comp import experiment
from tff_comp.tasks import stackoverflow_tag

POSTS = {
  'u1': [('how do i sort a list', 'sort list', 'python|list'), ('use sorted', 'sorting', 'python')],
  'u2': [('what is a list', 'lists', 'java|arrays|unknowntag')],
  'u3': [('zzz qqq', 'nothing known', 'rare')],
  'h1': [('a', 'b', 'python')],
  't1': [('sort the list ok', 'sort', 'list|java')],
}
SPLITS = {'u1': 'train', 'u2': 'train', 'u3': 'train', 'h1': 'heldout', 't1': 'test'}
# 'java' and 'list' tie: TFF's order keeps the file's (not the names'), checked here.
TAG_COUNTS = {'python': 9, 'java': 5, 'list': 5, 'arrays': 2, 'rare': 1}


def _write_files(folder):
  import tensorflow_federated as tff

  def dataset(client_id):
    tokens, titles, tags = zip(*POSTS[client_id])
    n = len(tokens)
    return tf.data.Dataset.from_tensor_slices(
      collections.OrderedDict(
        creation_date=['2020'] * n,
        score=np.zeros(n, np.int64),
        tags=list(tags),
        title=list(titles),
        tokens=list(tokens),
        type=['question'] * n,
      )
    )

  tff.simulation.datasets.save_to_sql_client_data(
    list(SPLITS), dataset, str(folder / 'stackoverflow.sqlite'), split_names_by_client_id=SPLITS
  )
  (folder / 'stackoverflow.word_count').write_text('list 9\nsort 8\na 7\nhow 6\nwhat 5\npython 4\n')
  (folder / 'stackoverflow.tag_count').write_text(json.dumps(TAG_COUNTS))


def test_reads_tffs_files_offline_into_tffs_preprocessing_and_trains(tmp_path):
  import tensorflow_federated as tff
  from tensorflow_federated.python.simulation.baselines.stackoverflow import (
    tag_prediction_preprocessing as tff_preprocessing,
  )

  _write_files(tmp_path)
  prepared = experiment.prepare(
    experiment.ExperimentConfig.of(
      algorithm='fedavg',
      task='stackoverflow_tag',
      rounds=2,
      clients_per_round=2,
      eval_period=2,
      batch_size=2,
      task_options=dict(data_dir=str(tmp_path), vocab_size=5, tag_vocab_size=3),
      output_dir=str(tmp_path / 'run'),
    )
  )
  task = prepared.task
  assert sorted(task.train_data.client_ids) == ['u1', 'u2', 'u3']
  # The vocabularies as TFF's loaders order them (their own functions download the
  # files, so they are not called here), then TFF's own preprocessing.
  words = ['list', 'sort', 'a', 'how', 'what']
  tags = ['python', 'java', 'list']  # 'java' before 'list': the file's order
  assert stackoverflow_tag.tag_vocabulary(str(tmp_path), 3) == tags
  spec = tff.simulation.baselines.ClientSpec(num_epochs=1, batch_size=1, shuffle_buffer_size=1)
  raw, _, _ = tff.simulation.datasets.stackoverflow.load_data(cache_dir=str(tmp_path))
  for user in ('u1', 'u2', 'u3'):
    theirs = list(
      tff_preprocessing.create_preprocess_fn(spec, words, tags)(
        raw.create_tf_dataset_for_client(user)
      ).as_numpy_iterator()
    )
    ours = list(task.train_data.create_tf_dataset_for_client(user).as_numpy_iterator())
    assert len(ours) == len(theirs) == len(POSTS[user])
    for (x, y), (tx, ty) in zip(ours, theirs):
      np.testing.assert_array_equal(x, tx[0])
      np.testing.assert_array_equal(y, ty[0])
  # u1's first post: 'how do i sort a list sort list': six known words of eight.
  x, y = next(iter(task.train_data.create_tf_dataset_for_client('u1')))
  np.testing.assert_allclose(x, np.array([2, 2, 1, 1, 0]) / 6, rtol=1e-6)
  np.testing.assert_array_equal(y, [1, 0, 1])
  final = experiment.run_experiment(prepared, show_progress=False)
  # config.json names every data file the task read, with its size and fingerprint.
  files = json.loads((tmp_path / 'run' / 'config.json').read_text())['environment']['data_files']
  assert sorted(pathlib.Path(p).name for p in files) == [
    'stackoverflow.sqlite',
    'stackoverflow.tag_count',
    'stackoverflow.word_count',
  ]
  tags = files[str(tmp_path / 'stackoverflow.tag_count')]
  assert tags['bytes'] == len(json.dumps(TAG_COUNTS)) and len(tags['sha256_head_tail']) == 64
  for name in ('loss', 'recall_at_5', 'precision_at_5', 'precision'):
    assert np.isfinite(final[f'eval/test_{name}']) and np.isfinite(final[f'eval/train_{name}'])
  (tmp_path / 'stackoverflow.tag_count').unlink()
  with pytest.raises(experiment.ConfigError, match='stackoverflow.tag_count not found'):
    experiment.prepare(
      experiment.ExperimentConfig.of(
        algorithm='fedavg',
        task='stackoverflow_tag',
        task_options=dict(data_dir=str(tmp_path)),
        output_dir=str(tmp_path / 'run2'),
      )
    )


@pytest.mark.parametrize('as_sparse', [False, True])
def test_metrics_equal_keras_metrics(as_sparse):
  rng = np.random.default_rng(0)
  n, words, tags = 300, 40, 12
  x = rng.random((n, words)).astype(np.float32) * (rng.random((n, words)) < 0.2)
  y = (rng.random((n, tags)) < 0.15).astype(np.float32)
  y[:5] = 0  # posts with no known tag count in precision@5, not in recall@5
  kernel = rng.normal(0, 3, (words, tags)).astype(np.float32)
  bias = rng.normal(-1, 1, tags).astype(np.float32)
  ours = stackoverflow_tag.score(kernel, bias, sparse.csr_matrix(x) if as_sparse else x, y)
  probabilities = tf.sigmoid(x @ kernel + bias)
  want = {}
  for name, metric in (
    ('recall_at_5', tf.keras.metrics.Recall(top_k=5)),
    ('precision_at_5', tf.keras.metrics.Precision(top_k=5)),
    ('precision', tf.keras.metrics.Precision()),
  ):
    metric.update_state(y, probabilities)
    want[name] = float(metric.result())
  # From the logits, as Keras computes it for a sigmoid layer's output (which carries
  # its logits); from the probabilities Keras clips them at 1e-7.
  want['loss'] = float(tf.keras.losses.BinaryCrossentropy(from_logits=True)(y, x @ kernel + bias))
  assert ours == pytest.approx(want, rel=1e-5)
  assert 0 < ours['recall_at_5'] < 1 and 0 < ours['precision'] < 1


def test_synthetic_source_has_the_real_shapes_and_a_learnable_signal():
  task = stackoverflow_tag.build_stackoverflow_tag_task(
    source='synthetic', max_clients=3, eval_examples=50, vocab_size=1000, tag_vocab_size=50
  )
  assert task.name == 'stackoverflow_tag[synthetic]' and task.num_clients == 3
  x, y = next(
    iter(task.train_data.create_tf_dataset_for_client(task.train_data.client_ids[1]).batch(1000))
  )
  assert x.shape[1:] == (1000,) and y.shape[1:] == (50,)
  np.testing.assert_allclose(tf.reduce_sum(x, 1), 1.0, rtol=1e-6)
  assert set(np.unique(y)) <= {0.0, 1.0} and np.all(np.sum(y, 1) >= 1)
  # The topic tag's block of words (20 per tag) carries half of each post's weight.
  topic_mass = np.sum(np.reshape(x, (-1, 50, 20)).sum(2) * y, 1)
  assert np.all(topic_mass >= 0.5 - 1e-6)
  # The same seed draws the same posts.
  again = stackoverflow_tag.build_stackoverflow_tag_task(
    source='synthetic', max_clients=3, eval_examples=50, vocab_size=1000, tag_vocab_size=50
  )
  x2, _ = next(
    iter(again.train_data.create_tf_dataset_for_client(again.train_data.client_ids[1]).batch(1000))
  )
  np.testing.assert_array_equal(x, x2)


def test_synthetic_source_runs_alike_on_tffs_runtime_and_in_process(tmp_path):
  finals = {}
  for runtime in ('tff', 'inprocess'):
    finals[runtime] = experiment.run_experiment(
      experiment.prepare(
        experiment.ExperimentConfig.of(
          algorithm='fedavg',
          task='stackoverflow_tag',
          runtime=runtime,
          rounds=2,
          clients_per_round=3,
          eval_period=2,
          client_learning_rate=10.0,
          task_options=dict(
            source='synthetic', max_clients=6, vocab_size=200, tag_vocab_size=20, eval_examples=100
          ),
          output_dir=str(tmp_path / runtime),
        )
      ),
      show_progress=False,
    )
  assert finals['tff']['eval/test_loss'] != finals['tff']['eval/train_loss']
  for name in ('test_loss', 'train_loss', 'test_recall_at_5'):
    assert finals['tff'][f'eval/{name}'] == pytest.approx(
      finals['inprocess'][f'eval/{name}'], rel=1e-5
    )
