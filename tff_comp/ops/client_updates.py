"""Client update rules: what one client computes from the broadcast and its data.

Each rule is pure TensorFlow (no TFF) with three functions, run by
`tff_comp.client_work.build_local_client_work` for every sampled client:

    state  = rule.initialize(payload, hparams)
    state  = rule.step(state, batch, hparams)          # once per local step
    update = rule.finalize(state, payload, hparams)

`payload` is what the server broadcast (model weights, or a dual state), `hparams` an
OrderedDict of float tensors held in the client work's state, so learning rates can be
read and set through the process. Updates follow TFF's sign convention: a client
reports the pseudo-gradient `start - end` (= -Delta in ../shared/algorithms.md), so a
server optimizer can apply it as a gradient.
"""

import abc
import collections
from typing import Any, NamedTuple

import tensorflow as tf

from tff_comp import regularizers as regularizers_lib
from tff_comp.ops import model_ops
from tff_comp.ops import objectives as objectives_lib

Weights = tuple[tf.Tensor, ...]


class LocalState(NamedTuple):
  """Loop state of every rule: the iterate, rule extras, and loss bookkeeping."""

  weights: Weights  # the trainable weights being trained (dual state for DA)
  extras: Any  # rule-specific tensors (e.g. elapsed step sizes)
  loss_sum: tf.Tensor  # sum over steps of batch loss x batch size
  examples: tf.Tensor  # examples processed
  steps: tf.Tensor  # local steps taken


class ClientUpdateRule(abc.ABC):
  """Local update rule on a FunctionalModel; see the module docstring.

  `batches_per_step`: a step receives this many batches concatenated (compositional
  rules draw separate inner and outer batches). `uses_reference_loss`: the client work
  computes, before local training, the largest loss of the round's clients at the
  broadcast model and passes it as hparams['reference_loss']. `uses_start_loss`: it
  passes the client's own loss on all its examples at the broadcast model as
  hparams['start_loss'].
  """

  batches_per_step: int = 1
  uses_reference_loss: bool = False
  uses_start_loss: bool = False  # hparams['start_loss']: own loss at the broadcast model
  uses_client_index: bool = False  # data are IndexedExamples; hparams['client_index']

  def __init__(self, model, *, learning_rate: float):
    self.model = model
    self._learning_rate = float(learning_rate)

  def initial_hparams(self) -> collections.OrderedDict:
    """The rule's hyperparameters, stored as float32 in the client work state."""
    return collections.OrderedDict(learning_rate=self._learning_rate)

  @abc.abstractmethod
  def start(self, payload) -> tuple[Weights, Weights, Any]:
    """(trainable start point, non-trainable weights, extras) from the payload."""

  @abc.abstractmethod
  def local_step(
      self,
      weights: Weights,
      extras: Any,
      batch: Any,
      hparams,
      payload,
  ) -> tuple[tf.Tensor, Weights, Any]:
    """One step on `batch`: returns (batch loss, new weights, new extras)."""

  def loss_and_gradient(self, weights: Weights, batch: Any, payload):
    """The model's loss on `batch` at `weights` and its gradient."""
    _, non_trainable, _ = self.start(payload)
    return model_ops.batch_loss_and_gradient(self.model, weights, non_trainable, batch)

  def update(self, start: Weights, state: LocalState, hparams) -> Any:
    """The update sent for aggregation; default: the pseudo-gradient start - end."""
    del hparams
    return tuple(a - b for a, b in zip(start, state.weights))

  def start_loss(self, payload, examples) -> tf.Tensor:
    """The client's loss at the broadcast model on all its examples (uses_start_loss)."""
    trainable, non_trainable, _ = self.start(payload)
    return model_ops.batch_loss(self.model, trainable, non_trainable, examples)

  def reference_value(self, payload, examples) -> tf.Tensor:
    """This client's candidate for the round's reference loss (uses_reference_loss)."""
    return self.start_loss(payload, examples)

  def client_weight(self, payload, hparams) -> tf.Tensor | None:
    """This client's aggregation weight, or None for the client work's weighting."""
    del payload, hparams
    return None

  def initialize(self, payload, hparams) -> LocalState:
    del hparams
    trainable, _, extras = self.start(payload)
    return LocalState(
        tuple(trainable), extras, tf.constant(0.0), tf.constant(0, tf.int32),
        tf.constant(0, tf.int32))

  def step(self, state: LocalState, batch, payload, hparams) -> LocalState:
    loss, weights, extras = self.local_step(
        state.weights, state.extras, batch, hparams, payload
    )
    size = model_ops.batch_size_of(batch)
    return LocalState(
        weights,
        extras,
        state.loss_sum + loss * tf.cast(size, tf.float32),
        state.examples + size,
        state.steps + 1,
    )

  def finalize(self, state: LocalState, payload, hparams) -> Any:
    trainable, _, _ = self.start(payload)
    return self.update(tuple(trainable), state, hparams)


class SGD(ClientUpdateRule):
  """Local SGD, optionally with momentum, a proximal term (FedProx) or a regularizer
  subgradient.

      v_{k+1} = rho v_k + g_k + mu (w_k - w_r) + s_k,   s_k in d psi(w_k)
      w_{k+1} = w_k - eta_c v_{k+1}

  rho = mu = 0 and no regularizer is FedAvg's client; mu > 0 is FedProx's; rho > 0 is
  heavy-ball momentum (reset every round); a regularizer gives the naive composite
  baseline "FedAvg with subgradients". Payload: the broadcast ModelWeights.
  """

  def __init__(
      self,
      model,
      *,
      learning_rate: float,
      proximal_strength: float = 0.0,
      momentum: float = 0.0,
      subgradient_of: regularizers_lib.Regularizer | None = None,
  ):
    super().__init__(model, learning_rate=learning_rate)
    self._mu = float(proximal_strength)
    self._rho = float(momentum)
    self._subgradient_of = subgradient_of

  def initial_hparams(self):
    hparams = super().initial_hparams()
    if self._mu:
      hparams['proximal_strength'] = self._mu
    if self._rho:
      hparams['momentum'] = self._rho
    return hparams

  def start(self, payload):
    trainable = tuple(payload.trainable)
    # extras: the start point (for the proximal term) and the velocity (for momentum),
    # carried through the loop only when used.
    start = trainable if self._mu else ()
    velocity = tuple(tf.zeros_like(w) for w in trainable) if self._rho else ()
    return trainable, tuple(payload.non_trainable), (start, velocity)

  def local_step(self, weights, extras, batch, hparams, payload):
    start, velocity = extras
    loss, grads = self.loss_and_gradient(weights, batch, payload)
    if self._mu:
      mu = hparams['proximal_strength']
      grads = tuple(g + mu * (w - w0) for g, w, w0 in zip(grads, weights, start))
    if self._subgradient_of is not None:
      grads = tuple(
          g + s for g, s in zip(grads, self._subgradient_of.subgradient(weights))
      )
    if self._rho:
      grads = tuple(hparams['momentum'] * v + g for v, g in zip(velocity, grads))
      velocity = grads
    lr = hparams['learning_rate']
    return loss, tuple(w - lr * g for w, g in zip(weights, grads)), (start, velocity)

  def gradient_weight_norm(self, steps: tf.Tensor, hparams) -> tf.Tensor:
    """||a||_1 with Delta = -eta G a over `steps` local steps (FedNova, Wang et al.
    2020): tau for SGD; sum_k (1 - rho^(tau-k)) / (1 - rho) with momentum rho;
    sum_k (1 - eta mu)^(tau-1-k) with the proximal term mu."""
    tau = tf.cast(steps, tf.float32)
    if self._rho and self._mu:
      raise ValueError('FedNova defines ||a||_1 for momentum or a proximal term, not both.')
    if self._subgradient_of is not None:
      raise ValueError('FedNova is not defined with a regularizer subgradient.')
    if self._rho:
      rho = hparams['momentum']
      return (tau - rho * (1 - rho**tau) / (1 - rho)) / (1 - rho)
    if self._mu:
      decay = 1 - hparams['learning_rate'] * hparams['proximal_strength']
      return tf.math.divide_no_nan(1 - decay**tau, 1 - decay)
    return tau


class NormalizedUpdate(NamedTuple):
  """An update with the l1 norm of its gradient-weighting vector a (FedNova)."""

  delta: Weights  # pseudo-gradient: start - end = eta G a
  a_norm: tf.Tensor  # ||a||_1


class Normalized(ClientUpdateRule):
  """Wraps an SGD rule so each client also reports ||a_i||_1 (FedNova's client)."""

  def __init__(self, rule: SGD):
    super().__init__(rule.model, learning_rate=rule.initial_hparams()['learning_rate'])
    self._rule = rule

  def initial_hparams(self):
    return self._rule.initial_hparams()

  def start(self, payload):
    return self._rule.start(payload)

  def local_step(self, weights, extras, batch, hparams, payload):
    return self._rule.local_step(weights, extras, batch, hparams, payload)

  def update(self, start, state, hparams):
    return NormalizedUpdate(
        self._rule.update(start, state, hparams),
        self._rule.gradient_weight_norm(state.steps, hparams))


class ElapsedUpdate(NamedTuple):
  """An update with the client's elapsed learning-rate sum (sum of eta_c)."""

  delta: Weights  # pseudo-gradient: start - end
  lr_sum: tf.Tensor


class CompositeRule(ClientUpdateRule):
  """A rule for F + psi: holds the regularizer and whether clients apply its prox.

  Its update is an `ElapsedUpdate`: the pseudo-gradient and the sum of eta_c.
  """

  def __init__(
      self,
      model,
      *,
      learning_rate: float,
      regularizer: regularizers_lib.Regularizer,
      client_prox: bool = True,
  ):
    super().__init__(model, learning_rate=learning_rate)
    self._regularizer = regularizer
    self._client_prox = client_prox

  def update(self, start, state, hparams):
    return ElapsedUpdate(super().update(start, state, hparams), state.extras)


class ProximalSGD(CompositeRule):
  """Federated mirror descent's client (FedMiD): prox after each SGD step.

      w_{k+1} = prox_{eta_c psi}(w_k - eta_c g_k)

  With `client_prox=False` the client runs plain SGD (FedMiD-OSP: only the server
  applies the prox). Reports the pseudo-gradient and its sum of eta_c.
  Payload: the broadcast ModelWeights.
  """

  def start(self, payload):
    return tuple(payload.trainable), tuple(payload.non_trainable), tf.constant(0.0)

  def local_step(self, weights, lr_sum, batch, hparams, payload):
    lr = hparams['learning_rate']
    loss, grads = self.loss_and_gradient(weights, batch, payload)
    weights = tuple(w - lr * g for w, g in zip(weights, grads))
    if self._client_prox:
      weights = self._regularizer.prox(weights, lr)
    return loss, weights, lr_sum + lr


class DualAveraging(CompositeRule):
  """Federated dual averaging's client (FedDualAvg).

  From the broadcast dual state z_r and the server's elapsed coefficient
  c_r (= eta_s eta_c r K with equal steps), for k < K:

      w_k = prox_{(c_r + e_k) psi}(z_k),  e_k = sum of the client's eta_c so far
      z_{k+1} = z_k - eta_c grad f(w_k; batch)

  With `client_prox=False` gradients are taken at w_k = z_k (FedDualAvg-OSP).
  Reports the dual pseudo-gradient z_r - z_K and its sum of eta_c.
  Payload: DualPayload (dual ModelWeights and the elapsed coefficient).
  """

  def start(self, payload):
    dual = payload.dual
    return (
        tuple(dual.trainable),
        tuple(dual.non_trainable),
        tf.constant(0.0),
    )

  def primal(self, dual: Weights, elapsed: tf.Tensor) -> Weights:
    if not self._client_prox:
      return dual
    return self._regularizer.prox(dual, elapsed)

  def local_step(self, dual, lr_sum, batch, hparams, payload):
    lr = hparams['learning_rate']
    primal = self.primal(dual, payload.elapsed + lr_sum)
    loss, grads = self.loss_and_gradient(primal, batch, payload)
    return loss, tuple(z - lr * g for z, g in zip(dual, grads)), lr_sum + lr


class ObjectiveRule(ClientUpdateRule):
  """A rule on a compositional objective g(f(w)): holds the objective, draws two batches
  per step when its outer function reads data, and takes the round's reference loss
  when the objective has an exponential scale (gamma)."""

  def __init__(self, model, *, learning_rate: float, objective):
    super().__init__(model, learning_rate=learning_rate)
    self.objective = objective
    self.batches_per_step = 2 if objective.outer_uses_data else 1
    self.uses_reference_loss = 'gamma' in objective.hparams()

  def initial_hparams(self):
    hparams = super().initial_hparams()
    hparams.update(self.objective.hparams())
    return hparams

  def reference_value(self, payload, examples):
    trainable, non_trainable, _ = self.start(payload)
    return self.objective.reference_value(self.model, trainable, non_trainable, examples)

  def inner_and_outer_batches(self, batch: Any) -> tuple[Any, Any]:
    """(B, B~): the step's two halves, or the same batch twice when outer reads none."""
    if self.batches_per_step == 1:
      return batch, batch
    return split_batches(batch, 2)


class CompositionalSGD(ObjectiveRule):
  """ComFedL's client (Huang and Li): tau local steps on g(f(w)).

      w <- w - eta_c grad g(f(w; B); B~)^T J f(w; B)

  with fresh batches B (inner) and B~ (outer, when the objective's outer reads data),
  computed as one vector-Jacobian product. Payload: the broadcast ModelWeights.
  """

  def start(self, payload):
    return tuple(payload.trainable), tuple(payload.non_trainable), ()

  def local_step(self, weights, extras, batch, hparams, payload):
    _, non_trainable, _ = self.start(payload)
    inner_batch, outer_batch = self.inner_and_outer_batches(batch)
    g, inner_value, direction = objectives_lib.compositional_gradient(
        self.objective, self.model, weights, non_trainable, inner_batch, outer_batch,
        hparams)
    lr = hparams['learning_rate']
    loss = self.objective.reported_loss(self.model, inner_value, outer_batch, g, hparams)
    return loss, tuple(w - lr * d for w, d in zip(weights, direction)), extras


def split_batches(batch: Any, parts: int) -> tuple[Any, ...]:
  """A concatenation of `parts` batches split back into `parts` consecutive pieces; a
  short batch gives its first pieces one example more (ceil division)."""
  size = (model_ops.batch_size_of(batch) + parts - 1) // parts
  return tuple(tf.nest.map_structure(lambda t, i=i: t[i * size:(i + 1) * size], batch)
               for i in range(parts))



class TrackerPayload(NamedTuple):
  """Local-SCGDM's broadcast: model, inner-value tracker u, momentum m, and the
  reference loss m was expressed in (DRFL); `started` is 0 before the first round."""

  weights: Any  # ModelWeights
  u: Any
  m: Weights
  reference_loss: tf.Tensor
  started: tf.Tensor


class TrackerUpdate(NamedTuple):
  """A Local-SCGDM client's report: model pseudo-gradient, final u and m."""

  delta: Weights
  u: Any
  m: Weights
  reference_loss: tf.Tensor


class SCGDM(ObjectiveRule):
  """Local-SCGDM's client (Gao, Li, Huang): tracker u of f, momentum m, step t:

      t = 0:  u = f(x; xi),  z = J f(x; xi)^T grad g(u; zeta),  m = z
      else:   u <- (1 - gamma eta) u + gamma eta f(x; xi)
              z = J f(x; xi)^T grad g(u; zeta)
              m <- (1 - alpha eta) m + alpha eta z
      x <- x - beta eta m

  t = 0 is the very first step of training (`started` = 0 in the payload); later rounds
  start from the server's averaged u and m. `tracking_gamma` is the gamma above (not
  DRFL's gamma). Payload: TrackerPayload; update: TrackerUpdate.
  """

  def __init__(self, model, *, learning_rate: float, objective, alpha: float,
               beta: float, tracking_gamma: float):
    super().__init__(model, learning_rate=learning_rate, objective=objective)
    self._alpha, self._beta, self._tracking_gamma = float(alpha), float(beta), float(tracking_gamma)

  def initial_hparams(self):
    hparams = super().initial_hparams()
    hparams.update(alpha=self._alpha, beta=self._beta, tracking_gamma=self._tracking_gamma)
    return hparams

  def _reference(self, hparams):
    return hparams['reference_loss'] if self.uses_reference_loss else tf.constant(0.0)

  def start(self, payload):
    weights = payload.weights
    return tuple(weights.trainable), tuple(weights.non_trainable), (
        payload.u, tuple(payload.m), payload.started)

  def initialize(self, payload, hparams):
    state = super().initialize(payload, hparams)
    u, m, started = state.extras
    m = self.objective.rescale_direction(
        m, payload.reference_loss, self._reference(hparams), hparams)
    return state._replace(extras=(u, tuple(m), started))

  def local_step(self, weights, extras, batch, hparams, payload):
    u, m, started = extras
    _, non_trainable, _ = self.start(payload)
    inner_batch, outer_batch = self.inner_and_outer_batches(batch)
    eta = hparams['learning_rate']
    with tf.GradientTape() as tape:
      tape.watch(weights)
      value = self.objective.inner(self.model, weights, non_trainable, inner_batch)
    first = tf.equal(started, 0.0)
    rate = hparams['tracking_gamma'] * eta
    u = tf.nest.map_structure(
        lambda old, new: tf.where(first, new, (1 - rate) * old + rate * new), u, value)
    with tf.GradientTape() as outer_tape:
      outer_tape.watch(u)
      g = self.objective.outer(self.model, u, outer_batch, hparams)
    z = tuple(tape.gradient(value, weights, output_gradients=outer_tape.gradient(g, u)))
    momentum = hparams['alpha'] * eta
    m = tuple(tf.where(first, zi, (1 - momentum) * mi + momentum * zi) for mi, zi in zip(m, z))
    new_weights = tuple(w - hparams['beta'] * eta * mi for w, mi in zip(weights, m))
    # The loss reported is the objective's at the current iterate (not at tracker u).
    loss = self.objective.reported_loss(
        self.model, value, outer_batch,
        self.objective.outer(self.model, value, outer_batch, hparams), hparams)
    return loss, new_weights, (u, m, tf.constant(1.0))

  def update(self, start, state, hparams):
    u, m, _ = state.extras
    return TrackerUpdate(super().update(start, state, hparams), u, m, self._reference(hparams))


class QUpdate(NamedTuple):
  """A q-FFL client's report: Delta_i = F_i^q Dw_i and h_i."""

  delta: Weights
  h: tf.Tensor


class QFFL(SGD):
  """q-FedAvg's client (Li, Sanjabi, Beirami, Smith, ICLR 2020).

  Local SGD from w gives w_local; with L = 1/eta_c, Dw = L (w - w_local) and F = the
  client's loss at w on all its examples:

      Delta = F^q Dw,   h = q F^(q-1) ||Dw||^2 + L F^q

  The server steps w <- w - sum Delta / sum h. q = 0 weighs clients equally (the
  server step is then the mean of Dw / L, FedAvg with uniform weights).
  """

  uses_start_loss = True

  def __init__(self, model, *, learning_rate: float, q: float):
    super().__init__(model, learning_rate=learning_rate)
    self._q = float(q)

  def initial_hparams(self):
    hparams = super().initial_hparams()
    hparams['q'] = self._q
    return hparams

  def update(self, start, state, hparams):
    lipschitz = 1.0 / hparams['learning_rate']
    dw = tuple(lipschitz * d for d in super().update(start, state, hparams))
    f, q = hparams['start_loss'], hparams['q']
    norm_sq = tf.add_n([tf.reduce_sum(tf.square(d)) for d in dw])
    return QUpdate(tuple(f**q * d for d in dw),
                   q * f ** (q - 1) * norm_sq + lipschitz * f**q)


class AFLUpdate(NamedTuple):
  """An AFL client's report: its pseudo-gradient and its loss in its own slot."""

  delta: Weights
  losses: tf.Tensor  # [num_clients]: start loss at this client's index, else 0


class AFLPayload(NamedTuple):
  """AFL's broadcast: the model and the client weights lambda on the simplex."""

  weights: Any  # ModelWeights
  client_weights: tf.Tensor  # [num_clients]


class AgnosticSGD(SGD):
  """AFL's client (Mohri, Sivek, Suresh, ICML 2019; DRFL baseline of ComFedL): local
  SGD from the broadcast model, aggregated with weight lambda_i, and its loss at the
  broadcast model reported in slot i so the server can ascend on lambda."""

  uses_start_loss = True
  uses_client_index = True

  def __init__(self, model, *, learning_rate: float, num_clients: int):
    super().__init__(model, learning_rate=learning_rate)
    self._num_clients = num_clients

  def start(self, payload):
    return super().start(payload.weights)

  def client_weight(self, payload, hparams):
    return tf.gather(payload.client_weights, tf.cast(hparams['client_index'], tf.int32))

  def update(self, start, state, hparams):
    slot = tf.one_hot(tf.cast(hparams['client_index'], tf.int32), self._num_clients)
    return AFLUpdate(super().update(start, state, hparams), slot * hparams['start_loss'])


class DittoPayload(NamedTuple):
  """Ditto's broadcast: the global model and every client's personal model."""

  weights: Any  # ModelWeights
  personal: Weights  # per trainable tensor, [num_clients, *shape]


class DittoUpdate(NamedTuple):
  """A Ditto client's report: its pseudo-gradient of the global model, and its new
  personal model in its own slot of the table (zeros elsewhere) with a 1 in `visited`."""

  delta: Weights
  personal: Weights  # [num_clients, *shape]
  visited: tf.Tensor  # [num_clients]


class DittoSGD(SGD):
  """Ditto's client (Li, Hu, Beirami, Smith, ICML 2021): local SGD on the global model
  w (FedAvg's client) and, on the same batches, steps on its personal model v_i,

      v_i <- v_i - eta_p (grad f_i(v_i; b) + lam (v_i - w_r)),

  w_r being the round's broadcast global model. hparams: learning_rate (eta), lam and,
  unless eta_p is tied to eta (`personal_learning_rate=None`, so setting the learning
  rate sets both), personal_learning_rate (eta_p). Payload: DittoPayload; v_i is row i
  of its table.
  """

  uses_client_index = True

  def __init__(self, model, *, learning_rate: float, lam: float, num_clients: int,
               personal_learning_rate: float | None = None):
    super().__init__(model, learning_rate=learning_rate)
    self._personal_learning_rate, self._lam = personal_learning_rate, float(lam)
    self._num_clients = num_clients

  def initial_hparams(self):
    hparams = super().initial_hparams()
    if self._personal_learning_rate is not None:
      hparams['personal_learning_rate'] = float(self._personal_learning_rate)
    hparams['lam'] = self._lam
    return hparams

  def start(self, payload):
    return super().start(payload.weights)

  def initialize(self, payload, hparams):
    state = super().initialize(payload, hparams)
    index = tf.cast(hparams['client_index'], tf.int32)
    personal = tuple(table[index] for table in payload.personal)
    return state._replace(extras=(state.extras, personal))

  def local_step(self, weights, extras, batch, hparams, payload):
    sgd_extras, personal = extras
    loss, weights, sgd_extras = super().local_step(
        weights, sgd_extras, batch, hparams, payload)
    _, grads = self.loss_and_gradient(personal, batch, payload)
    lr = hparams.get('personal_learning_rate', hparams['learning_rate'])
    lam = hparams['lam']
    personal = tuple(v - lr * (g + lam * (v - w0))
                     for v, g, w0 in zip(personal, grads, payload.weights.trainable))
    return loss, weights, (sgd_extras, personal)

  def update(self, start, state, hparams):
    index = tf.cast(hparams['client_index'], tf.int32)
    _, personal = state.extras
    tables = tuple(tf.scatter_nd([[index]], v[tf.newaxis], [self._num_clients, *v.shape])
                   for v in personal)
    return DittoUpdate(super().update(start, state, hparams), tables,
                       tf.one_hot(index, self._num_clients))


class PerFedAvg(ClientUpdateRule):
  """Per-FedAvg's client (Fallah, Mokhtari, Ozdaglar, NeurIPS 2020): MAML steps on
  f_i(w - alpha grad f_i(w)), with three independent batches D, D', D'' per step:

      w~ = w - alpha grad f(w; D);   g = grad f(w~; D')
      exact: w <- w - beta (g - alpha H(w; D'') g)     (Hessian-vector product by autodiff)
      fo:    w <- w - beta g                            (first order)
      hf:    H g replaced by (grad f(w + delta g; D'') - grad f(w - delta g; D'')) / (2 delta)

  beta is the client learning rate. Payload: the broadcast ModelWeights.
  """

  batches_per_step = 3
  VARIANTS = ('exact', 'fo', 'hf')

  def __init__(self, model, *, learning_rate: float, alpha: float, variant: str = 'fo',
               delta: float = 1e-3):
    if variant not in self.VARIANTS:
      raise ValueError(f'variant={variant!r} is unknown; choose one of {self.VARIANTS}.')
    super().__init__(model, learning_rate=learning_rate)
    self._alpha, self._variant, self._delta = float(alpha), variant, float(delta)

  def initial_hparams(self):
    hparams = super().initial_hparams()
    hparams['alpha'] = self._alpha
    if self._variant == 'hf':
      hparams['delta'] = self._delta
    return hparams

  def start(self, payload):
    return tuple(payload.trainable), tuple(payload.non_trainable), ()

  def meta_gradient(self, weights, batches, hparams, non_trainable) -> tuple[tf.Tensor, Weights]:
    """(loss on D at w, the variant's estimate of the gradient of f(w - alpha grad f(w)))."""
    d, d_prime, d_second = batches
    alpha = hparams['alpha']
    loss, grad = model_ops.batch_loss_and_gradient(self.model, weights, non_trainable, d)
    adapted = tuple(w - alpha * g for w, g in zip(weights, grad))
    _, outer = model_ops.batch_loss_and_gradient(self.model, adapted, non_trainable, d_prime)
    if self._variant == 'fo':
      return loss, outer
    if self._variant == 'exact':
      hv = model_ops.hessian_vector_product(self.model, weights, non_trainable, d_second, outer)
    else:
      hv = model_ops.finite_difference_hvp(
          self.model, weights, non_trainable, d_second, outer, hparams['delta'])
    return loss, tuple(g - alpha * h for g, h in zip(outer, hv))

  def local_step(self, weights, extras, batch, hparams, payload):
    _, non_trainable, _ = self.start(payload)
    loss, direction = self.meta_gradient(weights, split_batches(batch, 3), hparams,
                                         non_trainable)
    lr = hparams['learning_rate']
    return loss, tuple(w - lr * d for w, d in zip(weights, direction)), extras


class TaskRobustMAML(PerFedAvg):
  """TR-MAML's client (Collins, Mokhtari, Shakkottai, NeurIPS 2020): Per-FedAvg steps,
  aggregated with the task weight p_i, reporting its post-adaptation loss
  L(w - alpha grad L(w; D); D) in slot i for the server's exponentiated-gradient ascent
  on p. Payload: AFLPayload (model, task weights)."""

  uses_start_loss = True
  uses_client_index = True

  def __init__(self, model, *, num_clients: int, **kwargs):
    super().__init__(model, **kwargs)
    self._num_clients = num_clients

  def start(self, payload):
    return super().start(payload.weights)

  def start_loss(self, payload, examples):
    trainable, non_trainable, _ = self.start(payload)
    _, grads = model_ops.batch_loss_and_gradient(self.model, trainable, non_trainable, examples)
    adapted = tuple(w - self._alpha * g for w, g in zip(trainable, grads))
    return model_ops.batch_loss(self.model, adapted, non_trainable, examples)

  def client_weight(self, payload, hparams):
    return tf.gather(payload.client_weights, tf.cast(hparams['client_index'], tf.int32))

  def update(self, start, state, hparams):
    slot = tf.one_hot(tf.cast(hparams['client_index'], tf.int32), self._num_clients)
    return AFLUpdate(super().update(start, state, hparams), slot * hparams['start_loss'])
