"""What crosses between server and clients: payloads (broadcast) and updates (reported).

Plain NamedTuples of tensors, shared by the client rules, the server rules and the
aggregators, so every layer names the same fields. An update whose side fields carry a
client's model-sized state (trackers, a personal model) says so with the class attribute
`reports_client_state = True`: differential privacy on the delta alone would leave
them un-noised (`reports_client_state`). `Weights` is a tuple of trainable
tensors; `weights` fields hold a ModelWeights-like (trainable, non_trainable) pair.
"""

from typing import Any, NamedTuple

import tensorflow as tf

from tff_comp.ops.model_ops import Weights


class ElapsedUpdate(NamedTuple):
  """A composite client's report: pseudo-gradient and its elapsed sum of eta_c."""

  delta: Weights  # start - end
  lr_sum: tf.Tensor


class NormalizedUpdate(NamedTuple):
  """A FedNova client's report: pseudo-gradient and ||a||_1 of its weighting vector."""

  delta: Weights  # start - end = eta G a
  a_norm: tf.Tensor


class DualPayload(NamedTuple):
  """FedDualAvg's broadcast: the dual state and the elapsed coefficient."""

  dual: Any  # ModelWeights of the dual state
  elapsed: tf.Tensor


class TrackerPayload(NamedTuple):
  """Local-SCGDM's broadcast: model, inner-value tracker u, momentum m, the reference
  loss m was expressed in (DRFL), and `started` (0 before the first round)."""

  weights: Any  # ModelWeights
  u: Any
  m: Weights
  reference_loss: tf.Tensor
  started: tf.Tensor


class TrackerUpdate(NamedTuple):
  """A Local-SCGDM client's report: pseudo-gradient, final u and m, its reference."""

  delta: Weights
  u: Any
  m: Weights
  reference_loss: tf.Tensor
  reports_client_state = True  # type: ignore[misc]


class QUpdate(NamedTuple):
  """A q-FFL client's report: Delta_i = F_i^q Dw_i and h_i."""

  delta: Weights
  h: tf.Tensor


class ClientWeightsPayload(NamedTuple):
  """AFL's and TR-MAML's broadcast: the model and the client weights on the simplex."""

  weights: Any  # ModelWeights
  client_weights: tf.Tensor  # [num_clients]

  # Per-client tables a client reads only at its own row (`runtime.client_rows`).
  client_rows = ('client_weights',)  # type: ignore[misc]


class SlotLossUpdate(NamedTuple):
  """A per-client-weighted client's report: pseudo-gradient, and its loss in its own
  slot of a [num_clients] vector (0 elsewhere)."""

  delta: Weights
  losses: tf.Tensor


class DittoPayload(NamedTuple):
  """Ditto's broadcast: the global model and every client's personal model."""

  weights: Any  # ModelWeights
  personal: Weights  # per trainable tensor, [num_clients, *shape]

  client_rows = ('personal',)  # type: ignore[misc]  # read at the client's own row


class DittoUpdate(NamedTuple):
  """A Ditto client's report: pseudo-gradient of the global model, its new personal
  model in its own row of the table (zeros elsewhere) and a 1 in `visited`."""

  delta: Weights
  personal: Weights  # [num_clients, *shape]
  visited: tf.Tensor  # [num_clients]
  reports_client_state = True  # type: ignore[misc]


def reports_client_state(update: Any) -> bool:
  """Whether an update (or its spec) carries a client's model-sized state."""
  return bool(getattr(type(update), 'reports_client_state', False))


class MemoryPayload(NamedTuple):
  """Local-MOML's broadcast (its memory kept across rounds): the model, every client's
  memory and whether it holds one yet."""

  weights: Any  # ModelWeights
  memory: Weights  # per trainable tensor, [num_clients, *shape]
  seen: tf.Tensor  # [num_clients]: 1 where the client's memory was set

  client_rows = ('memory', 'seen')  # type: ignore[misc]  # read at the client's own row


class MemoryUpdate(NamedTuple):
  """A Local-MOML client's report (memory kept across rounds): pseudo-gradient of the
  model, its memory in its own row of the table (zeros elsewhere) and a 1 in `visited`."""

  delta: Weights
  memory: Weights  # [num_clients, *shape]
  visited: tf.Tensor  # [num_clients]
  reports_client_state = True  # type: ignore[misc]
