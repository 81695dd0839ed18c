"""The terms of a local SGD step as small gradient transforms (as optax chains its
transforms), so local SGD, FedProx, momentum and SCAFFOLD are one step:

    d = g_k = grad f(w_k; batch)
    proximal        d <- d + mu (w_k - w_r)             FedProx (Li et al. 2020)
    subgradient     d <- d + s,  s in d psi(w_k)        the naive composite baseline
    control_variate d <- d + c - c_i                    SCAFFOLD (Karimireddy et al. 2020)
    momentum        v <- rho v + d;  d <- v             heavy ball, reset every round
    w_{k+1} = w_k - eta_c d

Each transform keeps its state for the round (the velocity, the correction) under its
name in the rule's extras, reads the round's start point w_r from the payload (so the
lanes engine keeps one copy for all its lanes, not a copy per lane), and names the
hyperparameters it reads (`hparams`: name -> initial value), so they are the rule's,
settable between rounds. `chain` applies them in order.
"""

import collections
from typing import Any, NamedTuple

import tensorflow as tf

from tff_comp.ops import regularizers as regularizers_lib
from tff_comp.ops.model_ops import Weights


class Transform:
  """A term of the step's direction. `init(start, payload)`: its state at the round's
  start point; `apply(direction, weights, state, hparams, start)`: (new direction, new
  state), `start` the round's start point."""

  name: str = ''
  hparams: dict[str, float] = {}

  def init(self, start: Weights, payload: Any) -> Any:
    del start, payload
    return ()

  def apply(
    self, direction: Weights, weights: Weights, state: Any, hparams, start: Weights
  ) -> tuple[Weights, Any]:
    raise NotImplementedError


class Proximal(Transform):
  """d + mu (w_k - w_r): pulls the iterate toward the round's start point w_r."""

  name = 'proximal'

  def __init__(self, strength: float = 0.0):
    self.hparams = {'proximal_strength': float(strength)}

  def apply(self, direction, weights, state, hparams, start):
    mu = hparams['proximal_strength']
    return tuple(d + mu * (w - w0) for d, w, w0 in zip(direction, weights, start)), state


class Subgradient(Transform):
  """d + s, s a subgradient of the regularizer psi at w_k."""

  name = 'subgradient'

  def __init__(self, regularizer: regularizers_lib.Regularizer):
    self._regularizer = regularizer

  def apply(self, direction, weights, state, hparams, start):
    del hparams, start
    return tuple(d + s for d, s in zip(direction, self._regularizer.subgradient(weights))), state


class Correction(NamedTuple):
  """A client's control variate c_i and its step correction c - c_i (SCAFFOLD)."""

  own: Weights
  correction: Weights


class ControlVariate(Transform):
  """d + c - c_i: SCAFFOLD's correction. Its state is set from the payload's control
  c and the client's own row c_i of the table (`correct`), which needs the client's
  index: zeros until then."""

  name = 'control_variate'

  def init(self, start, payload):
    zeros = tuple(tf.zeros_like(c) for c in payload.control)
    return Correction(zeros, zeros)

  @staticmethod
  def correct(payload, client_index: tf.Tensor) -> Correction:
    # tf.gather, not table[i]: XLA (the lanes engine) would compile a slice at a tensor
    # index as a constant, once per client.
    own = tuple(tf.gather(table, client_index) for table in payload.controls)
    return Correction(own, tuple(c - ci for c, ci in zip(payload.control, own)))

  def apply(self, direction, weights, state, hparams, start):
    del weights, hparams, start
    return tuple(d + c for d, c in zip(direction, state.correction)), state


class Momentum(Transform):
  """v <- rho v + d; the direction is v (reset to 0 every round)."""

  name = 'momentum'

  def __init__(self, rate: float = 0.0):
    self.hparams = {'momentum': float(rate)}

  def init(self, start, payload):
    del payload
    return tuple(tf.zeros_like(w) for w in start)

  def apply(self, direction, weights, state, hparams, start):
    del weights, start
    velocity = tuple(hparams['momentum'] * v + d for v, d in zip(state, direction))
    return velocity, velocity


def init(
  transforms: tuple[Transform, ...], start: Weights, payload: Any
) -> collections.OrderedDict:
  """The transforms' states at the round's start, by name."""
  return collections.OrderedDict((t.name, t.init(start, payload)) for t in transforms)


def chain(
  transforms: tuple[Transform, ...],
  gradient: Weights,
  weights: Weights,
  states: collections.OrderedDict,
  hparams,
  start: Weights,
) -> tuple[Weights, collections.OrderedDict]:
  """(the step's direction, the new states): `gradient` through each transform, from
  the round's start point `start`."""
  direction, new = gradient, collections.OrderedDict()
  for t in transforms:
    direction, new[t.name] = t.apply(direction, weights, states[t.name], hparams, start)
  return direction, new
