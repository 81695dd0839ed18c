"""A classification task over any federated data and any model.

`classification_task(name, train_data, test_data, model)` makes a `base.Task` of a TFF
`ClientData` of (x, y) examples (data a researcher brings: TFF's federated datasets
read offline, their own) and a classifier returning logits: a FunctionalModel, or a
Keras model through `keras_models.from_keras` (`models.keras_classifier` for flat
features). Evaluation scores the global model's mean cross-entropy and accuracy on the
pooled test examples (`test_loss`, `test_accuracy`; at most `test_examples` of them if
set) and on training examples (`train_loss`, `train_accuracy`; at most `eval_examples`
of them), drawn once, whole clients at a time. `masked_labels` (a sequence model's pad
token) are left out of the accuracies, as TFF's baselines mask them.

Register it under a name to run it from the experiment layer, e.g.

    registry.register_task('my_emnist')(
        lambda *, seed=0: classification.classification_task('my_emnist', train, test,
                                                              model))
"""

from collections.abc import Mapping
from typing import Any

import numpy as np
import tensorflow_federated as tff

from tff_comp.ops import regularizers
from tff_comp.ops import local_loop
from tff_comp.runtime import inprocess
from tff_comp.tasks import base

DEFAULTS = dict(rounds=100, clients_per_round=10, client_learning_rate=0.02,
                server_learning_rate=1.0, batch_size=20, local_epochs=1, eval_period=10)


def classification_task(name: str, train_data: tff.simulation.datasets.ClientData,
                        test_data: tff.simulation.datasets.ClientData,
                        model: tff.learning.models.FunctionalModel, *,
                        defaults: Mapping[str, Any] | None = None,
                        eval_examples: int = 10_000, test_examples: int | None = None,
                        masked_labels: tuple[int, ...] = (), seed: int = 0) -> base.Task:
  """The task; `defaults` override `DEFAULTS` (the run settings); `seed` draws the
  training examples scored (and the test examples, if `test_examples` caps them: None
  scores every test example)."""
  score = base.ClassifierScorer(model, masked_labels)
  x_test, y_test = (inprocess.client_arrays(test_data).examples if test_examples is None
                    else _sample(test_data, test_examples, seed))
  x_train, y_train = _sample(train_data, eval_examples, seed)

  def evaluate(trainable, psi) -> dict[str, float]:
    del psi  # no regularizer of its own; the run's does not change these scores
    train_loss, train_accuracy = score(trainable, x_train, y_train)
    test_loss, test_accuracy = score(trainable, x_test, y_test)
    return dict(train_loss=train_loss, train_accuracy=train_accuracy,
                test_loss=test_loss, test_accuracy=test_accuracy)

  return base.Task(name=name, model=model, train_data=train_data,
                   regularizer=regularizers.NoRegularizer(), evaluate=evaluate,
                   defaults={**DEFAULTS, **(defaults or {})})


def _sample(data: tff.simulation.datasets.ClientData, most: int,
            seed: int) -> tuple[np.ndarray, np.ndarray]:
  """At most `most` examples of `data`: whole clients in an order drawn from `seed`
  (only those are read, not the population)."""
  ids = list(data.client_ids)
  parts, count = [], 0
  for i in np.random.default_rng(seed).permutation(len(ids)):
    if count >= most:
      break
    x, y = (np.asarray(t) for t in local_loop.materialize(
        data.create_tf_dataset_for_client(ids[i])))
    parts.append((x, y))
    count += len(y)
  x, y = (np.concatenate(t) for t in zip(*parts))
  return x[:most], y[:most]
