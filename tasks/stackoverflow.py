"""StackOverflow next-word prediction (Reddi et al. 2021; TFF's `stackoverflow`
dataset): one client per user, 342,477 training users and about 135 million sentences.

* source 'tff': TFF's published files, read offline from `data_dir` (default ~/.tff;
  `tff_files`): `stackoverflow.sqlite` and the word counts `stackoverflow.word_count`
  (TFF's `load_word_counts` unpacks them under `datasets/`; either place is read).
  Preprocessing as TFF's word-prediction baseline
  (`tff.simulation.baselines.stackoverflow.word_prediction_preprocessing`, whose
  `build_to_ids_fn` is used here): the `vocab_size` most frequent words, ids 1..V, one
  out-of-vocabulary id, then begin and end ids, 0 pad; a sentence is begin, its first
  20 words and end (when shorter), padded to 21 ids; an example is (ids[:20], ids[1:]).
  The training population needs about 11 GB resident, so runs stream each round's
  cohort (`--data_memory_budget`, `runtime.inprocess.streaming`). Evaluation scores up to
  `eval_examples` test and training sentences (whole users, drawn once).
* source 'synthetic': sentences of the same shapes, each a walk of one Markov chain over
  the extended vocabulary (`generated.markov_sequences`: 3 successors an id, so a model
  can reach 0.6 accuracy, against 1e-4 by chance): 342,477 users (or `max_clients`) of
  lognormal sizes around the real mean of 397 sentences (the spread is an assumption),
  100 test users; outputs are labelled synthetic (task name
  `stackoverflow_nwp[synthetic]`).

Model `lstm`, the default on TFF's files: TFF's baseline
(`word_prediction_models.create_recurrent_model`): Embedding 96 (masking pad), LSTM
`lstm_units` (670 in the baseline), Dense 96, Dense to the extended vocabulary, a Keras
model (`keras_models.from_keras`). Model `bigram`, the default on the synthetic source:
each position's next id from its own id alone (Embedding 16 drawn from [-1, 1], Dense to
the extended vocabulary), what the synthetic first-order chain needs. With the task's
defaults it went from 1e-4 to 0.025 test accuracy in 6 rounds of FedAvg (0.005 of
FedDualAvg; about 18 s a round, the cohort streamed), where the LSTM's first rounds took
60-100 s each and stayed at chance; with Keras's default embedding (drawn from [-0.05,
0.05]) the bigram reached 0.00075 in those 6 rounds of FedAvg. Accuracy leaves out pad
positions (TFF's baseline's `accuracy_with_oov`), `accuracy_no_oov` also the
out-of-vocabulary id and `accuracy_no_oov_or_eos` also the end id, as TFF's baseline
reports them (Reddi et al.'s names; TFF 0.87 calls them `accuracy_without_out_of_vocab`
and `accuracy_without_out_of_vocab_or_end_of_sentence`); the cross-entropy counts every
position.
"""

import dataclasses
import pathlib
from typing import Literal

import tensorflow as tf
from tensorflow_federated.python.simulation.baselines.stackoverflow import (
  word_prediction_models as tff_models,
)
from tensorflow_federated.python.simulation.baselines.stackoverflow import (
  word_prediction_preprocessing as tff_preprocessing,
)

from tff_comp import keras_models, paths, registry
from tff_comp.tasks import base, classification, generated, tff_files

SEQUENCE_LENGTH = 20
USERS, MEAN_SENTENCES = 342_477, 397
_CHAIN = 0x50F  # the synthetic source's Markov chain's stream, apart from the walks'


def counts_file(data_dir: str, name: str, task: str) -> pathlib.Path:
  """TFF's counts file `stackoverflow.<name>` (word_count, tag_count) in `data_dir`
  (default ~/.tff) or its `datasets/` folder, where TFF's loaders unpack it.

  Raises:
    ValueError: (one line) it is in neither: where to fetch it, or `task`'s synthetic
      source.
  """
  folder = pathlib.Path(data_dir or tff_files.default_dir())
  for path in (folder / f'stackoverflow.{name}', folder / 'datasets' / f'stackoverflow.{name}'):
    if path.is_file():
      paths.note_data_file(path)
      return path
  raise ValueError(
    f'{folder / f"stackoverflow.{name}"} not found: fetch'
    f' https://storage.googleapis.com/tff-datasets-public/stackoverflow.{name}.tar.bz2'
    f' and unpack it there (tar xjf), or run --{task}_source=synthetic.'
  )


def vocabulary(data_dir: str, size: int, task: str = 'stackoverflow_nwp') -> list[str]:
  """The `size` most frequent words of TFF's stackoverflow.word_count (one
  'word count' line each, most frequent first), read offline."""
  with open(counts_file(data_dir, 'word_count', task), encoding='utf-8') as f:
    return [line.split()[0] for _, line in zip(range(size), f)]


@registry.register_task('stackoverflow_nwp')
def build_stackoverflow_nwp_task(
  *,
  source: Literal['tff', 'synthetic'] = 'tff',
  data_dir: str = '',
  model: Literal['auto', 'lstm', 'bigram'] = 'auto',
  vocab_size: int = 10_000,
  lstm_units: int = 670,
  max_clients: int = 0,
  eval_examples: int = 10_000,
  seed: int = 0,
) -> base.Task:
  """StackOverflow next-word prediction (see the module docstring).

  Args:
    source: 'tff' (TFF's files, offline) or 'synthetic' (same shapes).
    data_dir: the folder holding stackoverflow.sqlite and stackoverflow.word_count.
    model: 'lstm' (TFF's baseline), 'bigram', or 'auto': 'lstm' on TFF's files, 'bigram'
      on the synthetic source.
    vocab_size: the most frequent words kept (10,000 in the baseline).
    lstm_units: the LSTM's units (670 in the baseline).
    max_clients: train on the first this many users only (0: all of them).
    eval_examples: test and training sentences scored at each evaluation.
    seed: the synthetic data, the evaluation sample and the initial weights.
  """
  if min(vocab_size, lstm_units, eval_examples) < 1 or max_clients < 0:
    raise ValueError('vocab_size, lstm_units and eval_examples must be >= 1, max_clients >= 0.')
  if model == 'auto':
    model = 'bigram' if source == 'synthetic' else 'lstm'
  if model not in ('lstm', 'bigram'):
    raise ValueError(f"model={model!r} is unknown; choose 'auto', 'lstm' or 'bigram'.")
  extended = vocab_size + 4  # pad, one out-of-vocabulary id, begin, end
  if model == 'lstm':  # embedding, LSTM, dense to the embedding, dense to the words
    embedding = 96
    weights = (
      extended * embedding
      + 4 * lstm_units * (embedding + lstm_units + 1)
      + (lstm_units + 1) * embedding
      + (embedding + 1) * extended
    )
    what = f'vocab_size={vocab_size}, lstm_units={lstm_units}'
  else:  # generated.bigram_model: Embedding 16, Dense to the ids
    weights, what = 16 * extended + 17 * extended, f'model=bigram, vocab_size={vocab_size}'
  base.check_model_fits(weights, what)
  special = tff_preprocessing.get_special_tokens(vocab_size)
  if source == 'tff':
    to_ids = tff_preprocessing.build_to_ids_fn(vocabulary(data_dir, vocab_size), SEQUENCE_LENGTH)

    def examples(dataset: tf.data.Dataset) -> tf.data.Dataset:
      def split(example):
        ids = to_ids(example)
        ids = tf.ensure_shape(
          tf.pad(ids, tf.reshape(tf.stack([0, SEQUENCE_LENGTH + 1 - tf.shape(ids)[0]]), [1, 2])),
          [SEQUENCE_LENGTH + 1],
        )
        return tf.cast(ids[:-1], tf.float32), tf.cast(ids[1:], tf.int32)

      return dataset.map(split)

    train, _, test = tff_files.load(
      'stackoverflow',
      data_dir,
      hint=(
        'point --stackoverflow_nwp_data_dir at its folder, or run'
        ' --stackoverflow_nwp_source=synthetic'
      ),
    )
    train, test = train.preprocess(examples), test.preprocess(examples)
    train = tff_files.first_clients(train, max_clients)
  elif source == 'synthetic':

    def make(n, key):
      ids = generated.markov_sequences(n, key, [seed, _CHAIN], extended, SEQUENCE_LENGTH + 1)
      return tf.cast(ids[:, :-1], tf.float32), ids[:, 1:]

    train = generated.client_data(
      'train',
      generated.lognormal_sizes(max_clients or USERS, MEAN_SENTENCES, seed, 1.0),
      seed,
      make,
    )
    test = generated.client_data(
      'test', generated.lognormal_sizes(100, MEAN_SENTENCES, seed + 1, 1.0), seed, make
    )
  else:
    raise ValueError(f"source={source!r} is unknown; choose 'tff' or 'synthetic'.")
  tf.keras.utils.set_random_seed(seed)
  network = keras_models.from_keras(
    tff_models.create_recurrent_model(extended, lstm_size=lstm_units)
    if model == 'lstm'
    # Keras's default draw, [-0.05, 0.05], moved a 10,004-way softmax too slowly (the
    # module docstring)
    else generated.bigram_model(
      extended, SEQUENCE_LENGTH, tf.keras.initializers.RandomUniform(-1, 1)
    ),
    tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    (
      tf.TensorSpec([None, SEQUENCE_LENGTH], tf.float32),
      tf.TensorSpec([None, SEQUENCE_LENGTH], tf.int32),
    ),
  )
  task = classification.classification_task(
    'stackoverflow_nwp' if source == 'tff' else 'stackoverflow_nwp[synthetic]',
    train,
    test,
    network,
    seed=seed,
    eval_examples=eval_examples,
    test_examples=eval_examples,
    masked_labels=(special.padding,),
    also_masked=dict(
      accuracy_no_oov=tuple(special.out_of_vocab),
      accuracy_no_oov_or_eos=(*special.out_of_vocab, special.end_of_sentence),
    ),
    defaults=dict(
      clients_per_round=50, batch_size=16, client_learning_rate=0.3, rounds=1500, eval_period=100
    ),
  )
  return dataclasses.replace(task, resolved_options={'model': model})
