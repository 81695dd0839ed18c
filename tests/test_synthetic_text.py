"""The synthetic sources of the next-id tasks (Shakespeare, StackOverflow NWP) carry a
signal a model can learn (#76): a bigram table counted here on half of the clients
predicts the other half's next ids at about the chain's top probability (0.6), where
the uniform ids these sources drew before give 1/V. The counting is written here,
independent of the generator (`tasks.generated.markov_sequences`)."""

import numpy as np
import pytest

from tff_comp import registry

CASES = {
  'shakespeare': dict(max_clients=40),
  'stackoverflow_nwp': dict(max_clients=40, vocab_size=200, lstm_units=8, eval_examples=100),
}


def _windows(data, clients) -> tuple[np.ndarray, np.ndarray]:
  xs, ys = zip(
    *(
      (x.numpy().astype(np.int64), y.numpy())
      for cid in clients
      for x, y in data.create_tf_dataset_for_client(cid).batch(100_000)
    )
  )
  return np.concatenate(xs), np.concatenate(ys)


@pytest.mark.parametrize('task', sorted(CASES))
def test_the_synthetic_next_id_sources_are_one_learnable_chain(task):
  built = registry.get_task(task).builder(source='synthetic', **CASES[task])
  clients = built.train_data.client_ids
  x, y = _windows(built.train_data, clients[::2])
  ids = int(max(x.max(), y.max())) + 1
  assert x.min() >= 1 and y.min() >= 1  # never the pad id, which accuracy leaves out
  # Windows: each label is the next input.
  np.testing.assert_array_equal(x[:, 1:], y[:, :-1])
  counts = np.zeros((ids, ids))
  np.add.at(counts, (x.ravel(), y.ravel()), 1)
  held_x, held_y = _windows(built.train_data, clients[1::2])
  accuracy = np.mean(counts.argmax(1)[held_x.ravel()] == held_y.ravel())
  assert 0.55 < accuracy < 0.7, accuracy
  # The same seed draws the same windows.
  again = registry.get_task(task).builder(source='synthetic', **CASES[task])
  first = _windows(again.train_data, clients[:1])[0]
  np.testing.assert_array_equal(first, x[: len(first)])


@pytest.mark.parametrize('task', sorted(CASES))
def test_the_synthetic_sources_default_to_the_bigram_model_their_chain_needs(task):
  """'auto' resolves to the bigram model on the synthetic source (TFF's LSTM on TFF's
  files: test_classification_tasks.py)."""
  small = dict(CASES[task], max_clients=2)
  builder = registry.get_task(task).builder
  assert builder(source='synthetic', **small).resolved_options == {'model': 'bigram'}
  lstm = builder(source='synthetic', **small, model='lstm')
  assert lstm.resolved_options == {'model': 'lstm'}
  with pytest.raises(ValueError, match="model='gru' is unknown"):
    builder(source='synthetic', **small, model='gru')
