"""A classification task over any federated data and any model.

`classification_task(name, train_data, test_data, model)` makes a `base.Task` of a TFF
`ClientData` of (x, y) examples (data a researcher brings: TFF's federated datasets
read offline, their own) and a classifier returning logits: a FunctionalModel, or a
Keras model through `keras_models.from_keras` (`models.keras_classifier` for flat
features). Evaluation scores the global model's mean cross-entropy and accuracy on the
pooled test examples (`test_loss`, `test_accuracy`; at most `test_examples` of them if
set) and on training examples (`train_loss`, `train_accuracy`; at most `eval_examples`
of them), drawn once, whole clients at a time. `masked_labels` (a sequence model's pad
token) are left out of the accuracies, as TFF's baselines mask them; `also_masked` adds
named accuracies leaving out more (`test_<name>`, `train_<name>`).

Register it under a name to run it from the experiment layer, e.g.

    registry.register_task('my_emnist')(
        lambda *, seed=0: classification.classification_task('my_emnist', train, test,
                                                              model))
"""

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import tensorflow_federated as tff

from tff_comp import data as data_lib
from tff_comp.ops import local_loop, regularizers
from tff_comp.tasks import base

DEFAULTS = dict(
  rounds=100,
  clients_per_round=10,
  client_learning_rate=0.02,
  server_learning_rate=1.0,
  batch_size=20,
  local_epochs=1,
  eval_period=10,
)


def classification_task(
  name: str,
  train_data: tff.simulation.datasets.ClientData,
  test_data: tff.simulation.datasets.ClientData,
  model: tff.learning.models.FunctionalModel,
  *,
  defaults: Mapping[str, Any] | None = None,
  eval_examples: int = 10_000,
  test_examples: int | None = None,
  masked_labels: tuple[int, ...] = (),
  also_masked: Mapping[str, tuple[int, ...]] | None = None,
  seed: int = 0,
) -> base.Task:
  """The task; `defaults` override `DEFAULTS` (the run settings); `seed` draws the
  training examples scored (and the test examples, if `test_examples` caps them: None
  scores every test example)."""
  scorer = base.ClassifierScorer(model, masked_labels, also_masked)
  x_test, y_test = (
    data_lib.client_arrays(test_data).examples
    if test_examples is None
    else sample(test_data, test_examples, seed)
  )
  x_train, y_train = sample(train_data, eval_examples, seed)

  def evaluate(trainable, psi) -> dict[str, float]:
    del psi  # no regularizer of its own; the run's does not change these scores
    return {
      f'{split}_{name}': value
      for split, (x, y) in (('train', (x_train, y_train)), ('test', (x_test, y_test)))
      for name, value in scorer.scores(trainable, x, y).items()
    }

  return base.Task(
    name=name,
    model=model,
    train_data=train_data,
    regularizer=regularizers.NoRegularizer(),
    evaluate=evaluate,
    defaults={**DEFAULTS, **(defaults or {})},
  )


def sample_clients(
  data: tff.simulation.datasets.ClientData, most: int, seed: int
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
  """Whole clients' (x, y) arrays in an order drawn from `seed`, until at least `most`
  examples (only those clients are read, not the population)."""
  ids = list(data.client_ids)
  count = 0
  for i in np.random.default_rng(seed).permutation(len(ids)):
    if count >= most:
      return
    x, y = (
      np.asarray(t) for t in local_loop.materialize(data.create_tf_dataset_for_client(ids[i]))
    )
    count += len(y)
    yield x, y


def sample(
  data: tff.simulation.datasets.ClientData, most: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
  """At most `most` examples of `data`, from `sample_clients`."""
  x, y = (np.concatenate(t) for t in zip(*sample_clients(data, most, seed)))
  return x[:most], y[:most]
