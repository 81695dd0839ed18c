"""Data poisoning, simulated: label flipping (`--attack=label_flip`).

A fixed set of clients poison their own training data: each client is an attacker with
probability `fraction`, drawn statelessly from (the task's data seed, the client's id),
and trains on labels y in {0, ..., C - 1} replaced by C - 1 - y (Fang et al. 2020's
label flipping; Tolpegin et al. 2020, "Data Poisoning Attacks Against Federated
Learning Systems"). Unlike the update attacks (`ops.aggregators.attacks`, drawn afresh
each round and sent in place of an update), a data poisoner owns its device, so its
clients stay the same over rounds, and what it sends is an honest update of the wrong
objective: the aggregation sees no sign of it. Evaluation data are untouched.

The flip lives in the clients' dataset function (`flipped`), so every runtime (the
in-process engines, TFF's, Ray's actors, async, streaming) trains on the same poisoned
examples; `attackers` gives the same set in Python, for the round's count
(`run.callbacks.Attackers`).
"""

from collections.abc import Sequence
import dataclasses
from typing import Any

import numpy as np
import tensorflow as tf

from tff_comp import task as task_lib
from tff_comp.ops.aggregators import attacks

KIND = attacks.LABEL_FLIP  # registered there, with no stage


def is_attacker(client_id: tf.Tensor, fraction: float, seed: int) -> tf.Tensor:
  """Whether the client `client_id` (a string scalar) poisons its data: a uniform draw
  of the stateless seed (seed, a 64-bit fingerprint of the id) below `fraction`."""
  key = tf.strings.to_hash_bucket_fast(client_id, 2**62)
  draw = tf.random.stateless_uniform([], tf.stack([tf.constant(seed, tf.int64), key]))
  return draw < fraction


def attackers(client_ids: Sequence[str], fraction: float, seed: int) -> frozenset[str]:
  """The attackers among `client_ids` (`is_attacker` on each)."""
  if not client_ids:
    return frozenset()
  decide = tf.function(
    lambda ids: tf.map_fn(
      lambda cid: is_attacker(cid, fraction, seed), ids, fn_output_signature=tf.bool
    )
  )
  chosen = decide(tf.constant(list(client_ids))).numpy()
  return frozenset(np.asarray(client_ids, object)[chosen])


@dataclasses.dataclass(frozen=True)
class _FlippedDatasets:
  """The dataset function of a flipped ClientData: a picklable value (Ray ships it)."""

  dataset_fn: Any
  classes: int
  fraction: float
  seed: int

  def __call__(self, client_id):
    flip = is_attacker(client_id, self.fraction, self.seed)
    last = tf.constant(self.classes - 1)

    def poisoned(x, y):
      return x, tf.where(flip, tf.cast(last, y.dtype) - y, y)

    return self.dataset_fn(client_id).map(poisoned)


def flipped(client_data, classes: int, fraction: float, seed: int):
  """`client_data` (examples (x, y), y integer labels in [0, classes)) with the labels of
  its attackers' examples flipped (module docstring)."""
  import tensorflow_federated as tff  # the flags need no TFF

  return tff.simulation.datasets.ClientData.from_clients_and_tf_fn(
    list(client_data.client_ids),
    _FlippedDatasets(client_data.serializable_dataset_fn, classes, fraction, seed),
  )


def why_not(client_data) -> str:
  """Why labels cannot be flipped ('' when they can): examples that are no (x, y) pair,
  or whose label is no integer."""
  spec = client_data.element_type_structure
  if not (isinstance(spec, tuple) and len(spec) == 2):
    return 'its examples are not (features, label) pairs'
  if not spec[1].dtype.is_integer:
    return f'its labels are {spec[1].dtype.name}, not integer classes'
  return ''


def classes_of(model) -> int:
  """C, the classes a classifier scores: the last dimension of its output for one
  example of its input spec."""
  x_spec = model.input_spec[0]
  shape = [1 if d is None else d for d in x_spec.shape]
  logits = model.predict_on_batch(model.initial_weights, tf.zeros(shape, x_spec.dtype), False)
  return int(logits.shape[-1])


def poisoned_task(task, fraction: float, seed: int):
  """`task` with its training clients' labels flipped (`flipped`), C from its model.

  Raises:
    ValueError: (one line) a task whose labels are no classes (`why_not`).
  """
  reason = why_not(task.train_data)
  if reason:
    raise ValueError(f'--attack={KIND} flips class labels, but {reason}.')
  return task_lib.with_train_data(
    task, flipped(task.train_data, classes_of(task.model), fraction, seed)
  )
