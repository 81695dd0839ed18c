"""constrained_digits (bundled data, EMNIST loader offline) and sparse_logreg."""

import collections
import csv
import sqlite3

import numpy as np
import pytest
import tensorflow as tf

from tff_comp import experiment
from tff_comp.runtime import inprocess
from tff_comp.tasks import constrained_digits, partitions, sparse_logreg


def test_dirichlet_partition_covers_every_example_once():
  labels = np.repeat(np.arange(10), 30)
  parts = partitions.dirichlet(labels, 12, 0.5, np.random.default_rng(0))
  joined = np.sort(np.concatenate(parts))
  np.testing.assert_array_equal(joined, np.arange(len(labels)))
  assert all(len(p) > 0 for p in parts)


@pytest.mark.parametrize('algorithm', ['fedmid', 'fedmid_osp', 'feddualavg', 'feddualavg_osp'])
def test_constraint_holds_at_every_round(algorithm, tmp_path):
  prepared = experiment.prepare(
    experiment.ExperimentConfig.of(
      algorithm=algorithm,
      task='constrained_digits',
      rounds=12,
      eval_period=1,
      output_dir=str(tmp_path),
    )
  )
  final = experiment.run_experiment(prepared, show_progress=False)
  with open(tmp_path / 'metrics.csv') as f:
    violations = [float(r['eval/constraint_violation']) for r in csv.DictReader(f)]
  assert len(violations) == 13 and max(violations) == 0.0
  assert final['eval/accuracy'] > 0.3  # learning happens under the constraint


def test_unconstrained_fedavg_violates_the_constraint(tmp_path):
  prepared = experiment.prepare(
    experiment.ExperimentConfig.of(
      algorithm='fedavg', task='constrained_digits', rounds=20, output_dir=str(tmp_path)
    )
  )
  final = experiment.run_experiment(prepared, show_progress=False)
  assert final['eval/constraint_violation'] > 0  # so the test above is not vacuous


def _emnist_fixture(directory):
  """A tiny emnist_all.sqlite in TFF's schema: 2 train writers, 1 test writer."""
  rng = np.random.default_rng(0)
  connection = sqlite3.connect(directory / 'emnist_all.sqlite')
  connection.execute(
    'CREATE TABLE examples (split_name TEXT, client_id TEXT, serialized_example_proto BLOB)'
  )
  connection.execute(
    'CREATE TABLE client_metadata (client_id TEXT, split_name TEXT, num_examples INTEGER)'
  )
  for split, client, n in [
    ('digits_only_train', 'f0000_14', 5),
    ('digits_only_train', 'f0001_41', 3),
    ('digits_only_test', 'f0000_14', 4),
  ]:
    for _ in range(n):
      example = tf.train.Example(
        features=tf.train.Features(
          feature={
            'pixels': tf.train.Feature(
              float_list=tf.train.FloatList(value=rng.random(784).astype(np.float32))
            ),
            'label': tf.train.Feature(int64_list=tf.train.Int64List(value=[int(rng.integers(10))])),
          }
        )
      )
      connection.execute(
        'INSERT INTO examples VALUES (?, ?, ?)', (split, client, example.SerializeToString())
      )
    connection.execute('INSERT INTO client_metadata VALUES (?, ?, ?)', (client, split, n))
  connection.commit()
  connection.close()


def test_emnist_loader_reads_tffs_format_offline(tmp_path):
  _emnist_fixture(tmp_path)
  train, x_test, y_test = constrained_digits.load_emnist(str(tmp_path))
  assert sorted(train.client_ids) == ['f0000_14', 'f0001_41']
  x, y = next(iter(train.create_tf_dataset_for_client('f0000_14').batch(100)))
  assert x.shape == (5, 784) and y.dtype == tf.int32
  assert x_test.shape == (4, 784) and y_test.shape == (4,)


def test_emnist_task_trains_offline(tmp_path):
  _emnist_fixture(tmp_path)
  prepared = experiment.prepare(
    experiment.ExperimentConfig.of(
      algorithm='feddualavg',
      task='constrained_digits',
      rounds=2,
      clients_per_round=2,
      task_options=dict(source='emnist', emnist_cache_dir=str(tmp_path)),
      output_dir=str(tmp_path / 'run'),
    )
  )
  final = experiment.run_experiment(prepared, show_progress=False)
  assert final['eval/constraint_violation'] == 0.0


def test_sparse_logreg_data_and_a_short_run(tmp_path):
  w_star, train, validation = sparse_logreg._generate(200, 10, 4.0, 5, 18, 2, 0.5, 0)
  assert np.count_nonzero(w_star) == 10 and len(train) == 5 and len(validation) == 2
  assert set(np.unique(train[0][1])) <= {0.0, 1.0}
  finals = {}
  for algorithm in ('fedavg', 'feddualavg'):
    prepared = experiment.prepare(
      experiment.ExperimentConfig.of(
        algorithm=algorithm,
        task='sparse_logreg',
        rounds=30,
        eval_period=30,
        task_options=dict(dim=300, support=10, num_clients=20),
        output_dir=str(tmp_path / algorithm),
      )
    )
    finals[algorithm] = experiment.run_experiment(prepared, show_progress=False)
  # Dual averaging with the L1 prox keeps the model sparse; FedAvg does not.
  assert finals['feddualavg']['eval/density'] < 0.8 * finals['fedavg']['eval/density']
  # It learns: held-out loss well below chance (log 2 = 0.693; measured 0.590, FedAvg's
  # 0.590) and accuracy well above 1/2 (measured 0.76), as good as FedAvg's loss.
  dual, plain = finals['feddualavg'], finals['fedavg']
  assert dual['eval/validation_loss'] < 0.63
  assert dual['eval/validation_loss'] < plain['eval/validation_loss'] + 0.01
  assert dual['eval/validation_accuracy'] > 0.68


def test_a_classification_task_over_any_client_data_trains_a_keras_cnn_in_process(
  tmp_path, monkeypatch
):
  """Bring data (a ClientData) and a Keras model: registered under a name, the task runs
  through the experiment, in-process, and learns (labels follow the brightest quadrant)."""
  import tensorflow_federated as tff

  from tff_comp import (
    keras_models,
    registry,
  )
  from tff_comp.tasks import classification

  def client(seed, n):
    rng = np.random.default_rng(seed)
    x = rng.random((n, 8, 8, 1), np.float32)
    label = rng.integers(0, 4, n)
    for i, q in enumerate(label):  # brighten quadrant q
      x[i, 4 * (q // 2) : 4 * (q // 2) + 4, 4 * (q % 2) : 4 * (q % 2) + 4] += 1.0
    return x, label.astype(np.int32)

  train = tff.simulation.datasets.TestClientData({f'c{i}': client(i, 20 + i) for i in range(6)})
  test = tff.simulation.datasets.TestClientData({'t': client(99, 200)})
  tf.keras.utils.set_random_seed(0)
  keras_model = tf.keras.Sequential(
    [
      tf.keras.layers.InputLayer((8, 8, 1)),
      tf.keras.layers.Conv2D(4, 3, activation='relu'),
      tf.keras.layers.MaxPool2D(),
      tf.keras.layers.Flatten(),
      tf.keras.layers.Dense(4),
    ]
  )
  model = keras_models.from_keras(
    keras_model,
    tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    (tf.TensorSpec([None, 8, 8, 1]), tf.TensorSpec([None], tf.int32)),
  )

  def build(*, seed: int = 0):
    return classification.classification_task(
      'brought', train, test, model, seed=seed, defaults=dict(client_learning_rate=0.1)
    )

  monkeypatch.setitem(
    registry.TASKS._entries,
    'brought',
    registry.Entry('brought', build),
  )
  prepared = experiment.prepare(
    experiment.ExperimentConfig.of(
      algorithm='fedavg',
      task='brought',
      rounds=30,
      clients_per_round=3,
      eval_period=30,
      output_dir=str(tmp_path),
    )
  )
  runner = experiment.build_runner(prepared)
  assert runner.runtime.name == 'inprocess'
  before = prepared.task.evaluate(tuple(model.initial_weights[0]), None)
  final = experiment.train_runner(prepared, runner, show_progress=False)
  assert final['eval/test_accuracy'] > 0.9 > before['test_accuracy']
  assert final['eval/train_loss'] < before['train_loss']


def _emnist_sql(directory):
  """A small emnist_all.sqlite written by TFF's own writer, in the schema TFF's loader
  reads: 3 train and 2 test writers of all 62 classes, 2 + 1 of digits."""
  import tensorflow_federated as tff

  from tff_comp.tasks import emnist  # noqa: F401  (registers the task)

  splits = {
    'w0': 'all_train',
    'w1': 'all_train',
    'w2': 'all_train',
    't0': 'all_test',
    't1': 'all_test',
    'd0': 'digits_only_train',
    'd1': 'digits_only_train',
    'dt': 'digits_only_test',
  }

  def dataset(client_id):
    rng = np.random.default_rng(sum(map(ord, client_id)))
    n = 5 + len(client_id)
    classes = 10 if client_id.startswith('d') else 62
    return tf.data.Dataset.from_tensor_slices(
      collections.OrderedDict(
        label=rng.integers(0, classes, n).astype(np.int64),
        pixels=rng.random((n, 28, 28)).astype(np.float32),
      )
    )

  tff.simulation.datasets.save_to_sql_client_data(
    list(splits), dataset, str(directory / 'emnist_all.sqlite'), split_names_by_client_id=splits
  )


@pytest.mark.parametrize(
  'only_digits, writers, classes',
  [(False, 3, 62), pytest.param(True, 2, 10, marks=pytest.mark.slow)],  # the digits' file
)
def test_emnist_reads_tffs_file_offline_and_trains_two_rounds(
  tmp_path, only_digits, writers, classes
):
  _emnist_sql(tmp_path)
  prepared = experiment.prepare(
    experiment.ExperimentConfig.of(
      algorithm='fedavg',
      task='emnist',
      rounds=2,
      clients_per_round=2,
      eval_period=1,
      task_options=dict(data_dir=str(tmp_path), only_digits=only_digits),
      output_dir=str(tmp_path / 'run'),
    )
  )
  task = prepared.task
  assert task.num_clients == writers
  x, y = next(
    iter(task.train_data.create_tf_dataset_for_client(task.train_data.client_ids[0]).batch(100))
  )
  assert x.shape[1:] == (28, 28, 1) and y.dtype == tf.int32
  assert task.model.initial_weights[0][-1].shape == (classes,)
  runner = experiment.build_runner(prepared)
  assert runner.runtime.name == 'inprocess'
  final = experiment.train_runner(prepared, runner, show_progress=False)
  assert np.isfinite(final['eval/test_loss']) and 0 <= final['eval/test_accuracy'] <= 1


def test_a_missing_dataset_file_is_one_line_naming_it(tmp_path):
  with pytest.raises(experiment.ConfigError) as error:
    experiment.prepare(
      experiment.ExperimentConfig.of(
        algorithm='fedavg',
        task='emnist',
        task_options=dict(data_dir=str(tmp_path)),
        output_dir=str(tmp_path / 'run'),
      )
    )
  message = str(error.value)
  assert '\n' not in message and str(tmp_path / 'emnist_all.sqlite') in message
  assert 'emnist_all.sqlite.lzma' in message and '--emnist_source=synthetic' in message


def test_a_dataset_file_without_tffs_split_names_is_one_line_naming_them(tmp_path):
  """A file written by save_to_sql_client_data without split names (TFF's loader raised
  a 37-line StopIteration), and a file that is not TFF's format."""
  import tensorflow_federated as tff

  tff.simulation.datasets.save_to_sql_client_data(
    ['w1', 'w2'],
    lambda c: tf.data.Dataset.from_tensor_slices(
      collections.OrderedDict(label=np.zeros(3, np.int64), pixels=np.zeros((3, 28, 28), np.float32))
    ),
    str(tmp_path / 'emnist_all.sqlite'),
  )
  config = experiment.ExperimentConfig.of(
    algorithm='fedavg',
    task='emnist',
    task_options=dict(data_dir=str(tmp_path)),
    output_dir=str(tmp_path / 'run'),
  )
  with pytest.raises(experiment.ConfigError) as error:
    experiment.prepare(config)
  message = str(error.value)
  assert '\n' not in message and "holds the splits ['default_split']" in message
  assert "reads ['all_train', 'all_test']" in message, message
  (tmp_path / 'emnist_all.sqlite').write_bytes(b'not a database at all' * 100)
  with pytest.raises(experiment.ConfigError, match='is not a TFF SQLite file'):
    experiment.prepare(config)


def test_synthetic_emnist_has_the_shapes_and_is_labelled(tmp_path):
  prepared = experiment.prepare(
    experiment.ExperimentConfig.of(
      algorithm='fedavg',
      task='emnist',
      rounds=1,
      clients_per_round=2,
      task_options=dict(source='synthetic', max_clients=4, model='softmax'),
      output_dir=str(tmp_path / 'run'),
    )
  )
  task = prepared.task
  assert task.name == 'emnist[synthetic]' and task.num_clients == 4
  sizes = [
    int(task.train_data.create_tf_dataset_for_client(c).reduce(0, lambda n, _: n + 1))
    for c in task.train_data.client_ids
  ]
  assert 50 < np.mean(sizes) < 600
  again = experiment.prepare(
    experiment.ExperimentConfig.of(
      algorithm='fedavg',
      task='emnist',
      clients_per_round=2,
      task_options=dict(source='synthetic', max_clients=4, model='softmax'),
      output_dir=str(tmp_path / 'run2'),
    )
  ).task
  a = next(iter(task.train_data.create_tf_dataset_for_client('train_1').batch(500)))
  b = next(iter(again.train_data.create_tf_dataset_for_client('train_1').batch(500)))
  np.testing.assert_array_equal(a[0], b[0])  # generated from the seed alike
  experiment.run_experiment(prepared, show_progress=False)
  assert '"source": "synthetic"' in (tmp_path / 'run' / 'config.json').read_text()


def test_emnist_cnn_dropout_is_tffs_baseline_model_and_trains(tmp_path):
  """TFF's `create_conv_dropout_model` (Reddi et al. 2021) layer for layer; with our
  weights its softmax output is ours (no dropout outside training); a round trains."""
  from tensorflow_federated.python.simulation.baselines.emnist import emnist_models

  from tff_comp.tasks import emnist

  ours, theirs = emnist.cnn(62, dropout=True), emnist_models.create_conv_dropout_model(False)
  assert [type(l).__name__ for l in ours.layers] == [type(l).__name__ for l in theirs.layers]
  assert [l.rate for l in ours.layers if isinstance(l, tf.keras.layers.Dropout)] == [
    l.rate for l in theirs.layers if isinstance(l, tf.keras.layers.Dropout)
  ]
  theirs.set_weights(ours.get_weights())
  x = np.random.default_rng(0).random((4, 28, 28, 1)).astype(np.float32)
  np.testing.assert_allclose(
    tf.nn.softmax(ours(x, training=False)), theirs(x, training=False), rtol=1e-5, atol=1e-6
  )
  prepared = experiment.prepare(
    experiment.ExperimentConfig.of(
      algorithm='fedavg',
      task='emnist',
      rounds=1,
      clients_per_round=2,
      eval_period=1,
      task_options=dict(source='synthetic', max_clients=3, model='cnn_dropout'),
      output_dir=str(tmp_path / 'run'),
    )
  )
  runner = experiment.build_runner(prepared)
  assert runner.runtime.engine == 'mapped' and 'too short' in runner.runtime.why
  # A run long enough for lanes is mapped too, for its Dropout masks.
  long_run = inprocess.build(prepared.build(), prepared.task.train_data, client_rounds=10**6)
  assert long_run.engine == 'mapped' and 'Dropout' in long_run.why
  final = experiment.train_runner(prepared, runner, show_progress=False)
  assert np.isfinite(final['eval/test_loss'])


def test_shakespeare_reads_tffs_file_offline_into_tffs_windows_and_trains(tmp_path):
  import tensorflow_federated as tff
  from tensorflow_federated.python.simulation.baselines.shakespeare import (
    char_prediction_preprocessing as tff_preprocessing,
  )

  lines = {
    'ROMEO': ['But soft, what light', 'It is the east'],
    'JULIET': ['O Romeo!'],
    'NURSE': ['Faith, I can tell ' * 12],
    'HAMLET': ['To be, or not to be'],
  }
  splits = {'ROMEO': 'train', 'JULIET': 'train', 'NURSE': 'train', 'HAMLET': 'test'}
  tff.simulation.datasets.save_to_sql_client_data(
    list(splits),
    lambda c: tf.data.Dataset.from_tensor_slices(collections.OrderedDict(snippets=lines[c])),
    str(tmp_path / 'shakespeare.sqlite'),
    split_names_by_client_id=splits,
  )
  prepared = experiment.prepare(
    experiment.ExperimentConfig.of(
      algorithm='fedavg',
      task='shakespeare',
      rounds=2,
      clients_per_round=2,
      eval_period=1,
      batch_size=2,
      task_options=dict(data_dir=str(tmp_path), lstm_units=8),
      output_dir=str(tmp_path / 'run'),
    )
  )
  task = prepared.task
  assert sorted(task.train_data.client_ids) == ['JULIET', 'NURSE', 'ROMEO']
  assert task.resolved_options == {'model': 'lstm'}  # TFF's baseline on TFF's file
  first_two = experiment.prepare(
    experiment.ExperimentConfig.of(
      algorithm='fedavg',
      task='shakespeare',
      clients_per_round=2,
      task_options=dict(data_dir=str(tmp_path), lstm_units=8, max_clients=2),
      output_dir=str(tmp_path / 'run2'),
    )
  ).task
  assert list(first_two.train_data.client_ids) == ['JULIET', 'NURSE']
  # TFF's own preprocessing of the same client, batch 1: the same windows.
  spec = tff.simulation.baselines.ClientSpec(num_epochs=1, batch_size=1, shuffle_buffer_size=1)
  raw, _ = tff.simulation.datasets.shakespeare.load_data(cache_dir=str(tmp_path))
  theirs = list(
    tff_preprocessing.create_preprocess_fn(spec)(
      raw.create_tf_dataset_for_client('NURSE')
    ).as_numpy_iterator()
  )
  ours = list(task.train_data.create_tf_dataset_for_client('NURSE').as_numpy_iterator())
  assert len(ours) == len(theirs) == 3  # 216 characters + begin/end: 3 windows of 81
  for (x, y), (tx, ty) in zip(ours, theirs):
    np.testing.assert_array_equal(x, tx[0])
    np.testing.assert_array_equal(y, ty[0])
  runner = experiment.build_runner(prepared)
  assert runner.runtime.name == 'inprocess'
  final = experiment.train_runner(prepared, runner, show_progress=False)
  assert np.isfinite(final['eval/test_loss'])


@pytest.mark.parametrize('model', ['cnn', pytest.param('resnet18', marks=pytest.mark.slow)])
def test_cifar100_reads_tffs_file_offline_and_trains_two_rounds(tmp_path, model):
  import tensorflow_federated as tff

  splits = {'0': 'train', '1': 'train', '2': 'train', '3': 'test'}

  def dataset(client_id):
    rng = np.random.default_rng(int(client_id))
    n = 4 + int(client_id)
    return tf.data.Dataset.from_tensor_slices(
      collections.OrderedDict(
        coarse_label=rng.integers(0, 20, n),
        image=rng.integers(0, 256, (n, 32, 32, 3)),
        label=rng.integers(0, 100, n),
      )
    )

  tff.simulation.datasets.save_to_sql_client_data(
    list(splits), dataset, str(tmp_path / 'cifar100.sqlite'), split_names_by_client_id=splits
  )
  prepared = experiment.prepare(
    experiment.ExperimentConfig.of(
      algorithm='fedavg',
      task='cifar100',
      rounds=2,
      clients_per_round=2,
      eval_period=2,
      batch_size=4,
      task_options=dict(data_dir=str(tmp_path), model=model, crop=16),
      output_dir=str(tmp_path / 'run'),
    )
  )
  x, y = next(iter(prepared.task.train_data.create_tf_dataset_for_client('1').batch(10)))
  assert x.shape == (5, 16, 16, 3) and y.dtype == tf.int32
  np.testing.assert_allclose(np.mean(x[0]), 0.0, atol=1e-5)  # standardized per image
  final = experiment.run_experiment(prepared, show_progress=False)
  assert np.isfinite(final['eval/test_loss'])


def test_stackoverflow_reads_tffs_files_offline_into_tffs_ids_and_trains(tmp_path):
  import tensorflow_federated as tff
  from tensorflow_federated.python.simulation.baselines.stackoverflow import (
    word_prediction_preprocessing as tff_preprocessing,
  )

  sentences = {
    'u1': ['how do i sort a list', 'use sorted'],
    'u2': ['what is a list'],
    'u3': [' '.join(['word'] * 30)],
    'h1': ['a'],
    't1': ['sort the list ok'],
  }
  splits = {'u1': 'train', 'u2': 'train', 'u3': 'train', 'h1': 'heldout', 't1': 'test'}

  def dataset(client_id):
    n = len(sentences[client_id])
    return tf.data.Dataset.from_tensor_slices(
      collections.OrderedDict(
        creation_date=['2020'] * n,
        score=np.zeros(n, np.int64),
        tags=['python'] * n,
        title=['t'] * n,
        tokens=sentences[client_id],
        type=['question'] * n,
      )
    )

  tff.simulation.datasets.save_to_sql_client_data(
    list(splits), dataset, str(tmp_path / 'stackoverflow.sqlite'), split_names_by_client_id=splits
  )
  (tmp_path / 'stackoverflow.word_count').write_text('list 9\nsort 8\na 7\nhow 6\nword 5\nwhat 4\n')
  prepared = experiment.prepare(
    experiment.ExperimentConfig.of(
      algorithm='fedavg',
      task='stackoverflow_nwp',
      rounds=2,
      clients_per_round=2,
      eval_period=2,
      batch_size=2,
      task_options=dict(data_dir=str(tmp_path), vocab_size=5, lstm_units=4),
      output_dir=str(tmp_path / 'run'),
    )
  )
  task = prepared.task
  assert sorted(task.train_data.client_ids) == ['u1', 'u2', 'u3']
  assert task.resolved_options == {'model': 'lstm'}  # TFF's baseline on TFF's files
  # TFF's own preprocessing of the same user, batch 1: the same ids.
  spec = tff.simulation.baselines.ClientSpec(num_epochs=1, batch_size=1, shuffle_buffer_size=1)
  raw, _, _ = tff.simulation.datasets.stackoverflow.load_data(cache_dir=str(tmp_path))
  vocab = ['list', 'sort', 'a', 'how', 'word']
  for user in ('u1', 'u3'):
    theirs = list(
      tff_preprocessing.create_preprocess_fn(spec, vocab)(
        raw.create_tf_dataset_for_client(user)
      ).as_numpy_iterator()
    )
    ours = list(task.train_data.create_tf_dataset_for_client(user).as_numpy_iterator())
    assert len(ours) == len(theirs)
    for (x, y), (tx, ty) in zip(ours, theirs):
      np.testing.assert_array_equal(x, tx[0])
      np.testing.assert_array_equal(y, ty[0])
  final = experiment.run_experiment(prepared, show_progress=False)
  assert np.isfinite(final['eval/test_loss'])
  # The accuracies as TFF's baseline's metrics score them, for a model that always
  # predicts the out-of-vocabulary id, then the end id (t1's labels: sort, oov, list,
  # oov, end, then pad).
  from tensorflow_federated.python.simulation.baselines import keras_metrics

  special = tff_preprocessing.get_special_tokens(5)
  ((x, y),) = tff_preprocessing.create_preprocess_fn(spec, vocab)(
    tff.simulation.datasets.stackoverflow.load_data(cache_dir=str(tmp_path))[
      2
    ].create_tf_dataset_for_client('t1')
  ).as_numpy_iterator()
  for always in (special.out_of_vocab[0], special.end_of_sentence):
    trainable = [np.array(w) for w in task.model.initial_weights[0]]
    trainable[-2][:] = 0  # the last Dense layer's kernel, then its bias
    trainable[-1][:] = 0
    trainable[-1][always] = 10
    ours = task.evaluate(tuple(trainable), None)
    for name, masked in (
      ('accuracy', []),
      ('accuracy_no_oov', special.out_of_vocab),
      ('accuracy_no_oov_or_eos', special.out_of_vocab + [special.end_of_sentence]),
    ):
      metric = keras_metrics.MaskedCategoricalAccuracy(masked_tokens=[special.padding] + masked)
      metric.update_state(y, task.model.predict_on_batch((tuple(trainable), ()), x, training=False))
      assert ours[f'test_{name}'] == pytest.approx(float(metric.result()))
    assert ours['test_accuracy'] > 0
  with pytest.raises(experiment.ConfigError, match='stackoverflow.word_count not found'):
    (tmp_path / 'stackoverflow.word_count').unlink()
    experiment.prepare(
      experiment.ExperimentConfig.of(
        algorithm='fedavg',
        task='stackoverflow_nwp',
        task_options=dict(data_dir=str(tmp_path)),
        output_dir=str(tmp_path / 'run2'),
      )
    )


def test_the_scorer_leaves_masked_labels_out_of_the_accuracy_and_chunks_alike():
  from tff_comp import models
  from tff_comp.tasks import base

  model = models.softmax_regression(3, 4)
  kernel = np.eye(3, 4, dtype=np.float32) * 5
  x = np.eye(3, dtype=np.float32)[np.arange(600) % 3]
  y = (np.arange(600) % 3).astype(np.int32)
  y[::2] = 0  # class 0 where the model says 1 or 2: wrong unless masked
  weights = (kernel, np.zeros(4, np.float32))
  loss, accuracy = base.ClassifierScorer(model)(weights, x, y)
  right = np.argmax(x @ kernel, 1) == y
  assert accuracy == pytest.approx(right.mean())
  _, masked = base.ClassifierScorer(model, (0,))(weights, x, y)
  assert masked == pytest.approx(right[y != 0].mean()) and masked == 1.0
  logits = x @ kernel
  want = np.mean(np.log(np.exp(logits).sum(1)) - logits[np.arange(600), y])
  assert loss == pytest.approx(want, rel=1e-5)  # 600 examples: three chunks of 256
  y[5::12] = 1  # where the model says 2: wrong unless 1 is masked too
  scores = base.ClassifierScorer(model, (), dict(no_zero=(0,), no_zero_one=(0, 1)))
  scores = scores.scores(weights, x, y)
  right = np.argmax(x @ kernel, 1) == y
  assert scores['accuracy'] == pytest.approx(right.mean())
  assert scores['no_zero'] == pytest.approx(right[y != 0].mean()) and scores['no_zero'] < 1
  assert scores['no_zero_one'] == pytest.approx(right[(y != 0) & (y != 1)].mean())
  assert scores['no_zero_one'] == 1


def test_a_scorer_is_built_once_when_two_threads_score_first(monkeypatch):
  """Batched trials score on threads: the first calls, together, build one graph (two
  builds mixed tensors of two graphs)."""
  import threading
  import time

  from tff_comp import models
  from tff_comp.tasks import base

  builds, build = [], base.ClassifierScorer._build

  def slow_build(self):
    builds.append(1)
    time.sleep(0.05)
    build(self)

  monkeypatch.setattr(base.ClassifierScorer, '_build', slow_build)
  scorer = base.ClassifierScorer(models.softmax_regression(3, 4))
  weights = (np.eye(3, 4, dtype=np.float32), np.zeros(4, np.float32))
  x, y = np.eye(3, dtype=np.float32), np.arange(3, dtype=np.int32)
  scores = []
  threads = [
    threading.Thread(target=lambda: scores.append(scorer(weights, x, y))) for _ in range(2)
  ]
  for thread in threads:
    thread.start()
  for thread in threads:
    thread.join()
  assert len(builds) == 1 and len(scores) == 2 and scores[0] == scores[1]


def test_cifar100_synthetic_runs_on_tffs_runtime_as_in_process(tmp_path):
  """TFF's runtime serializes the synthetic source's dataset function, so nothing it
  builds may be an eager tensor made outside it (the class templates once were)."""
  finals = {
    runtime: experiment.train(
      'fedavg',
      'cifar100',
      rounds=1,
      eval_period=1,
      clients_per_round=2,
      output_dir=str(tmp_path / runtime),
      cifar100_source='synthetic',
      cifar100_max_clients=4,
      cifar100_crop=8,
      runtime=runtime,
      show_progress=False,
    )
    for runtime in ('tff', 'inprocess')
  }
  np.testing.assert_allclose(
    finals['tff']['eval/test_loss'], finals['inprocess']['eval/test_loss'], rtol=1e-5
  )
