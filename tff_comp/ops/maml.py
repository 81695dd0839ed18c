"""Model-agnostic meta-learning clients: Per-FedAvg (Fallah, Mokhtari, Ozdaglar,
NeurIPS 2020), pure TF. Its server is FedAvg's (`sgd.OptimizerServer`); TR-MAML
(`per_client.AgnosticWeighted` around this rule) and the MAML objectives of ComFedL
(`ops.objectives`) reuse the same adaptation step, `model_ops.adapt`.

Per-FedAvg steps on f_i(w - alpha grad f_i(w)) with independent batches D, D', D'':

    w~ = w - alpha grad f(w; D);   g = grad f(w~; D')
    exact: w <- w - beta (g - alpha H(w; D'') g)     (Hessian-vector product by autodiff)
    fo:    w <- w - beta g                            (first order)
    hf:    H g replaced by (grad f(w + delta g; D'') - grad f(w - delta g; D'')) / (2 delta)

beta is the client learning rate.
"""

import typing
from typing import Literal

from tff_comp.ops import compositional
from tff_comp.ops import model_ops
from tff_comp.ops import rule as rule_lib

# The Hessian-vector product variants (builders annotate their option with it).
Variant = Literal['exact', 'fo', 'hf']


# Why a MAML run diverges, most often.
DIVERGENCE_HINT = ('the meta-gradient (with the exact Hessian term especially) can be'
                   ' several times the first-order one: try a smaller'
                   ' --client_learning_rate (beta) or --alpha')


class PerFedAvg(rule_lib.ClientRule):
  """Per-FedAvg's client (see the module docstring). Payload: the broadcast
  ModelWeights. Its start loss is the post-adaptation loss L(w - alpha grad L(w; D); D)
  on all the client's examples (what TR-MAML's server ascends on)."""

  batches_per_step = 3
  VARIANTS = typing.get_args(Variant)

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

  def start_loss(self, payload, examples, hparams):
    trainable, non_trainable, _ = self.start(payload)
    _, adapted = model_ops.adapt(self.model, trainable, non_trainable, examples,
                                 hparams['alpha'])
    return model_ops.batch_loss(self.model, adapted, non_trainable, examples)

  def meta_gradient(self, weights, batches, hparams,
                    non_trainable) -> tuple:
    """(loss on D at w, the variant's estimate of the gradient of f(w - alpha grad f(w)))."""
    d, d_prime, d_second = batches
    alpha = hparams['alpha']
    loss, adapted = model_ops.adapt(self.model, weights, non_trainable, d, alpha)
    _, outer = model_ops.batch_loss_and_gradient(self.model, adapted, non_trainable, d_prime)
    if self._variant == 'fo':
      return loss, outer
    if self._variant == 'exact':
      hv = model_ops.hessian_vector_product(self.model, weights, non_trainable, d_second,
                                            outer)
    else:
      hv = model_ops.finite_difference_hvp(
          self.model, weights, non_trainable, d_second, outer, hparams['delta'])
    return loss, tuple(g - alpha * h for g, h in zip(outer, hv))

  def local_step(self, weights, extras, batch, hparams, payload, context):
    del context
    _, non_trainable, _ = self.start(payload)
    loss, direction = self.meta_gradient(
        weights, compositional.split_batches(batch, 3), hparams, non_trainable)
    lr = hparams[rule_lib.LEARNING_RATE]
    return rule_lib.StepResult(loss, tuple(w - lr * d for w, d in zip(weights, direction)), extras)
