"""StackOverflow tag prediction (Reddi et al. 2021's "Stack Overflow LR"; TFF's
`stackoverflow` dataset): one client per user, a post's bag of words -> its tags.

* source 'tff': TFF's published files, read offline from `data_dir` (default ~/.tff;
  `tff_files`): `stackoverflow.sqlite`, the word counts `stackoverflow.word_count` and
  the tag counts `stackoverflow.tag_count` (JSON; TFF's `load_tag_counts` orders it by
  count, ties in file order). Preprocessing is TFF's tag baseline's
  (`tff.simulation.baselines.stackoverflow.tag_prediction_preprocessing.build_to_ids_fn`,
  used here): x is the post's (tokens and title) bag of the `vocab_size` most frequent
  words, normalized to sum 1 over in-vocabulary words; y marks which of the
  `tag_vocab_size` most frequent tags the post has (multi-label, 0/1).
* source 'synthetic': posts of the same shapes that a linear model can learn: each has
  a topic tag drawn uniformly, half of its `SYNTHETIC_WORDS` words from that tag's own
  block of the vocabulary and half uniform, and with probability 1/2 a second tag drawn
  uniformly (noise); 342,477 users (or `max_clients`) of lognormal sizes around the
  real mean of 397 posts, 100 test users; outputs are labelled synthetic (task name
  `stackoverflow_tag[synthetic]`).

Model: TFF's baseline logistic regression, one Dense layer with sigmoid outputs (Keras,
`keras_models.from_keras`), trained on the binary cross-entropy summed over the batch
(mean over tags), as TFF's baseline (`Reduction.SUM`: learning rates carry over).
Metrics (`score`), over up to `eval_examples` test and training posts (whole users,
drawn once): `loss` (the binary cross-entropy, mean over tags and posts),
`recall_at_5` and `precision_at_5` (micro-averaged over the five highest-scored tags,
as Keras's `Recall(top_k=5)`, TFF's baseline metric, and `Precision(top_k=5)`), and
`precision` (outputs above 1/2, as the baseline's `Precision()`).
"""

import json
from typing import Literal

import numpy as np
from scipy import sparse
import tensorflow as tf
from tensorflow_federated.python.simulation.baselines.stackoverflow import (
  tag_prediction_preprocessing as tff_preprocessing,
)

from tff_comp import keras_models, registry
from tff_comp.ops import regularizers
from tff_comp.tasks import base, classification, generated, stackoverflow, tff_files

TOP_K = 5
SYNTHETIC_WORDS = 16
CLIENT_LEARNING_RATE = 100.0


def tag_vocabulary(data_dir: str, size: int) -> list[str]:
  """The `size` most frequent tags of TFF's stackoverflow.tag_count (a JSON object tag
  -> count), in TFF's `load_tag_counts` order, read offline."""
  path = stackoverflow.counts_file(data_dir, 'tag_count', 'stackoverflow_tag')
  with open(path, encoding='utf-8') as f:
    counts = json.load(f)
  return [tag for tag, _ in sorted(counts.items(), key=lambda item: item[1], reverse=True)][:size]


def score(kernel: np.ndarray, bias: np.ndarray, x, y: np.ndarray) -> dict[str, float]:
  """The module docstring's metrics of the linear sigmoid model (kernel, bias) on posts
  x (dense or sparse rows) with 0/1 tags y, in NumPy."""
  logits = np.asarray(x @ kernel) + bias
  # Binary cross-entropy from the logits, stable for any scale.
  loss = np.maximum(logits, 0) - logits * y + np.log1p(np.exp(-np.abs(logits)))
  k = min(TOP_K, logits.shape[1])  # all of them when fewer tags than 5
  top = np.argpartition(-logits, k - 1, axis=1)[:, :k]
  hits = np.take_along_axis(y, top, axis=1).sum()
  predicted = logits > 0
  return dict(
    loss=float(loss.mean()),
    recall_at_5=float(hits / max(y.sum(), 1.0)),
    precision_at_5=float(hits / max(k * len(y), 1)),
    precision=float((predicted * y).sum() / max(predicted.sum(), 1)),
  )


def _sparse_sample(data, most: int, seed: int) -> tuple[sparse.csr_matrix, np.ndarray]:
  """`classification.sample`'s posts with x kept sparse (a dense row is 40 kB)."""
  parts = [(sparse.csr_matrix(x), y) for x, y in classification.sample_clients(data, most, seed)]
  return (
    sparse.vstack([x for x, _ in parts], format='csr')[:most],
    np.concatenate([y for _, y in parts])[:most],
  )


def _synthetic(vocab_size: int, tag_vocab_size: int):
  """The synthetic source's `make(n, key)` (module docstring)."""
  block = vocab_size // tag_vocab_size

  def make(n, key):
    keys = tf.random.experimental.stateless_split(key, 4)
    topic = tf.random.stateless_uniform([n, 1], keys[0], 0, tag_vocab_size, tf.int32)
    half = SYNTHETIC_WORDS // 2
    own = topic * block + tf.random.stateless_uniform([n, half], keys[1], 0, block, tf.int32)
    other = tf.random.stateless_uniform([n, half], keys[2], 0, vocab_size, tf.int32)
    words = tf.concat([own, other], 1)
    rows = tf.tile(tf.range(n)[:, None], [1, SYNTHETIC_WORDS])
    x = tf.scatter_nd(
      tf.stack([rows, words], -1),
      tf.fill([n, SYNTHETIC_WORDS], 1.0 / SYNTHETIC_WORDS),
      [n, vocab_size],
    )
    noise = tf.random.stateless_uniform([n, 2], keys[3])
    second = tf.cast(noise[:, 0] * tag_vocab_size, tf.int32)
    y = tf.minimum(
      tf.one_hot(topic[:, 0], tag_vocab_size)
      + tf.one_hot(second, tag_vocab_size) * tf.cast(noise[:, 1:] < 0.5, tf.float32),
      1.0,
    )
    return x, y

  return make


@registry.register_task('stackoverflow_tag')
def build_stackoverflow_tag_task(
  *,
  source: Literal['tff', 'synthetic'] = 'tff',
  data_dir: str = '',
  vocab_size: int = 10_000,
  tag_vocab_size: int = 500,
  max_clients: int = 0,
  eval_examples: int = 10_000,
  seed: int = 0,
) -> base.Task:
  """StackOverflow tag prediction (see the module docstring).

  Args:
    source: 'tff' (TFF's files, offline) or 'synthetic' (same shapes).
    data_dir: the folder holding stackoverflow.sqlite and the word and tag counts.
    vocab_size: the most frequent words kept (10,000 in the baseline).
    tag_vocab_size: the most frequent tags predicted (500 in the baseline).
    max_clients: train on the first this many users only (0: all of them).
    eval_examples: test and training posts scored at each evaluation.
    seed: the synthetic data, the evaluation sample and the initial weights.
  """
  if min(vocab_size, tag_vocab_size, eval_examples) < 1 or max_clients < 0:
    raise ValueError('vocab_size, tag_vocab_size and eval_examples must be >= 1, max_clients >= 0.')
  base.check_model_fits(
    (vocab_size + 1) * tag_vocab_size, f'vocab_size={vocab_size}, tag_vocab_size={tag_vocab_size}'
  )
  if source == 'tff':
    words = stackoverflow.vocabulary(data_dir, vocab_size, 'stackoverflow_tag')
    tags = tag_vocabulary(data_dir, tag_vocab_size)
    to_ids = tff_preprocessing.build_to_ids_fn(words, tags)
    # The shapes are the vocabularies' lengths: a small counts file holds fewer.
    vocab_size, tag_vocab_size = len(words), len(tags)
    train, _, test = tff_files.load(
      'stackoverflow',
      data_dir,
      hint=(
        'point --stackoverflow_tag_data_dir at its folder, or run'
        ' --stackoverflow_tag_source=synthetic'
      ),
    )
    train, test = (data.preprocess(lambda d: d.map(to_ids)) for data in (train, test))
    train = tff_files.first_clients(train, max_clients)
  elif source == 'synthetic':
    if vocab_size < tag_vocab_size:
      raise ValueError(
        'the synthetic source needs vocab_size >= tag_vocab_size (a block of words per tag).'
      )
    make = _synthetic(vocab_size, tag_vocab_size)
    train = generated.client_data(
      'train',
      generated.lognormal_sizes(
        max_clients or stackoverflow.USERS, stackoverflow.MEAN_SENTENCES, seed, 1.0
      ),
      seed,
      make,
    )
    test = generated.client_data(
      'test',
      generated.lognormal_sizes(100, stackoverflow.MEAN_SENTENCES, seed + 1, 1.0),
      seed,
      make,
    )
  else:
    raise ValueError(f"source={source!r} is unknown; choose 'tff' or 'synthetic'.")
  tf.keras.utils.set_random_seed(seed)
  # TFF's baseline model (tag_prediction_tasks._build_logistic_regression_model).
  keras_model = tf.keras.Sequential(
    [tf.keras.layers.Dense(tag_vocab_size, activation='sigmoid', input_shape=(vocab_size,))]
  )
  model = keras_models.from_keras(
    keras_model,
    tf.keras.losses.BinaryCrossentropy(from_logits=False, reduction=tf.keras.losses.Reduction.SUM),
    (
      tf.TensorSpec([None, vocab_size], tf.float32),
      tf.TensorSpec([None, tag_vocab_size], tf.float32),
    ),
  )
  x_test, y_test = _sparse_sample(test, eval_examples, seed)
  x_train, y_train = _sparse_sample(train, eval_examples, seed)

  def evaluate(trainable, psi) -> dict[str, float]:
    del psi  # no regularizer of its own
    return {
      f'{split}_{name}': value
      for split, (x, y) in (('train', (x_train, y_train)), ('test', (x_test, y_test)))
      for name, value in score(*trainable, x, y).items()
    }

  return base.Task(
    name='stackoverflow_tag' if source == 'tff' else 'stackoverflow_tag[synthetic]',
    model=model,
    train_data=train,
    regularizer=regularizers.NoRegularizer(),
    evaluate=evaluate,
    defaults={
      **classification.DEFAULTS,
      **dict(
        clients_per_round=10,
        batch_size=100,
        rounds=1500,
        eval_period=100,
        client_learning_rate=CLIENT_LEARNING_RATE,
      ),
    },
  )
