"""Shakespeare next-character prediction (Caldas et al. 2018, LEAF; TFF's `shakespeare`
dataset): one client per speaking role of each play.

* source 'tff': TFF's published file `shakespeare.sqlite`, read offline from
  `data_dir` (default ~/.tff; `tff_files`): 715 roles. Preprocessing as TFF's
  char-prediction baseline
  (`tff.simulation.baselines.shakespeare.char_prediction_preprocessing`): each snippet's
  characters to ids over TFF's `CHAR_VOCAB` (0 pad, then the vocabulary, out-of-
  vocabulary, begin and end tokens), bracketed by begin/end, padded to a multiple of
  81 and cut into windows of 81 ids; an example is (ids[:80], ids[1:]), the next
  character at every position (McMahan et al. 2017's sequence length 80).
* source 'synthetic': windows of the same shapes, each a walk of one Markov chain over
  the vocabulary (`generated.markov_sequences`: 3 successors an id, so a model can
  reach 0.6 accuracy, against 0.011 by chance), 715 clients, lognormal sizes around
  `SYNTHETIC_MEAN_WINDOWS` windows a client (an assumed size: the per-role statistics
  are not in TFF's documentation); outputs are labelled synthetic (task name
  `shakespeare[synthetic]`).

Model `lstm`, the default on TFF's file: TFF's baseline recurrent model
(`char_prediction_models.create_recurrent_model`): Embedding(vocabulary + 4, 8), two
LSTM layers of `lstm_units` (256 in the baseline) returning sequences, Dense to the
vocabulary, as a Keras model; it runs in-process on the mapped engine (`keras_models`).
Model `bigram`, the default on the synthetic source: each position's next id from its
own id alone (Embedding(vocabulary + 4, 16), Dense to the vocabulary), what the
synthetic source's first-order chain needs: it reaches 0.57 test accuracy in 30 rounds
of the task's defaults, where the LSTM stays at the unigram plateau for hundreds of
rounds (it leaves it after 1,000-2,000 centralized steps). Evaluation: cross-entropy
over every position of the test roles' windows and of training windows, and accuracy
over the non-pad positions (TFF's baseline's `MaskedCategoricalAccuracy(masked_tokens=
[pad])`).
"""

import dataclasses
from typing import Literal

import tensorflow as tf
from tensorflow_federated.python.simulation.baselines.shakespeare import (
  char_prediction_preprocessing as tff_preprocessing,
)

from tff_comp import keras_models, registry
from tff_comp.tasks import base, classification, generated, tff_files

SEQUENCE_LENGTH = 80
VOCABULARY = len(tff_preprocessing.CHAR_VOCAB) + 4  # pad, oov, bos, eos
ROLES = 715
SYNTHETIC_MEAN_WINDOWS = 50
_CHAIN = 0x5EA  # the synthetic source's Markov chain's stream, apart from the walks'


def _windows(dataset: tf.data.Dataset) -> tf.data.Dataset:
  """Snippets to (80 ids, the next 80 ids) windows, as TFF's baseline (no shuffling:
  the runtimes shuffle a client's examples)."""
  _, _, bos, eos = tff_preprocessing.get_special_tokens()
  table = tf.lookup.StaticVocabularyTable(
    tf.lookup.KeyValueTensorInitializer(
      tff_preprocessing.CHAR_VOCAB, tf.range(len(tff_preprocessing.CHAR_VOCAB), dtype=tf.int64)
    ),
    num_oov_buckets=1,
  )

  def to_ids(example):
    ids = table.lookup(tf.strings.bytes_split(example['snippets'])) + 1  # 0 is pad
    ids = tf.concat([[bos], ids, [eos]], 0)
    return tf.concat([ids, tf.zeros((-tf.shape(ids)[0]) % (SEQUENCE_LENGTH + 1), tf.int64)], 0)

  windows = dataset.map(to_ids).unbatch().batch(SEQUENCE_LENGTH + 1, drop_remainder=True)
  return windows.map(lambda w: (tf.cast(w[:-1], tf.float32), tf.cast(w[1:], tf.int32)))


def recurrent_model(lstm_units: int, seed: int = 0) -> tf.keras.Model:
  """TFF's baseline char-LSTM (see the module docstring); ids come in as float32 (the
  runtimes' example dtype), the embedding casts them."""
  tf.keras.utils.set_random_seed(seed)
  return tf.keras.Sequential(
    [
      tf.keras.layers.InputLayer((SEQUENCE_LENGTH,)),
      tf.keras.layers.Embedding(VOCABULARY, 8),
      tf.keras.layers.LSTM(lstm_units, return_sequences=True),
      tf.keras.layers.LSTM(lstm_units, return_sequences=True),
      tf.keras.layers.Dense(VOCABULARY),
    ]
  )


def _bigram_model(seed: int) -> tf.keras.Model:
  tf.keras.utils.set_random_seed(seed)
  return generated.bigram_model(VOCABULARY, SEQUENCE_LENGTH)


@registry.register_task('shakespeare')
def build_shakespeare_task(
  *,
  source: Literal['tff', 'synthetic'] = 'tff',
  data_dir: str = '',
  model: Literal['auto', 'lstm', 'bigram'] = 'auto',
  lstm_units: int = 256,
  max_clients: int = 0,
  seed: int = 0,
) -> base.Task:
  """Shakespeare (see the module docstring).

  Args:
    source: 'tff' (TFF's shakespeare.sqlite, offline) or 'synthetic' (same shapes).
    data_dir: the folder holding shakespeare.sqlite (default ~/.tff).
    model: 'lstm' (TFF's baseline), 'bigram', or 'auto': 'lstm' on TFF's file, 'bigram'
      on the synthetic source.
    lstm_units: units of each LSTM layer (256 in TFF's baseline).
    max_clients: train on the first this many roles only (0: all of them); synthetic
      data generate this many (0: 715).
    seed: the synthetic data and the model's initial weights.
  """
  if max_clients < 0 or lstm_units < 1:
    raise ValueError('max_clients must be >= 0 and lstm_units >= 1.')
  if model == 'auto':
    model = 'bigram' if source == 'synthetic' else 'lstm'
  if model not in ('lstm', 'bigram'):
    raise ValueError(f"model={model!r} is unknown; choose 'auto', 'lstm' or 'bigram'.")
  if source == 'tff':
    train, test = (data.preprocess(_windows) for data in tff_files.load('shakespeare', data_dir))
    train = tff_files.first_clients(train, max_clients)
  elif source == 'synthetic':
    clients = max_clients or ROLES

    def make(n, key):
      ids = generated.markov_sequences(n, key, [seed, _CHAIN], VOCABULARY, SEQUENCE_LENGTH + 1)
      return tf.cast(ids[:, :-1], tf.float32), ids[:, 1:]

    train, test = (
      generated.client_data(
        prefix, generated.lognormal_sizes(clients, SYNTHETIC_MEAN_WINDOWS, seed + salt), seed, make
      )
      for prefix, salt in (('train', 0), ('test', 1))
    )
  else:
    raise ValueError(f"source={source!r} is unknown; choose 'tff' or 'synthetic'.")
  network = keras_models.from_keras(
    recurrent_model(lstm_units, seed) if model == 'lstm' else _bigram_model(seed),
    tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    (
      tf.TensorSpec([None, SEQUENCE_LENGTH], tf.float32),
      tf.TensorSpec([None, SEQUENCE_LENGTH], tf.int32),
    ),
  )
  task = classification.classification_task(
    'shakespeare' if source == 'tff' else 'shakespeare[synthetic]',
    train,
    test,
    network,
    seed=seed,
    masked_labels=(0,),
    defaults=dict(
      clients_per_round=10, batch_size=4, client_learning_rate=1.0, rounds=1200, eval_period=100
    ),
  )
  return dataclasses.replace(task, resolved_options={'model': model})
