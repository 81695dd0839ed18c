"""Worker momentum (Karimireddy, He and Jaggi, ICML 2021, "Learning from History for
Byzantine Robust Optimization"; their ICLR 2022 bucketing paper's setting), a chain's
first stage: each client sends, in place of its update x_i, its momentum

    m_i <- beta m_i + (1 - beta) x_i,

m_i kept per client across rounds (d floats, a persistent row as error feedback's; zero
at first, and unchanged in the rounds the client sits out). Averaging over rounds
shrinks the honest updates' variance, which is what lets a robust combiner tell them
from an attacker's; attackers (the next stage) forge from the honest momenta.
"""

from tff_comp.ops.aggregators import base


class WorkerMomentum(base.Stage):
  """Worker momentum (module docstring) with factor `beta` in [0, 1)."""

  name = 'momentum'

  def __init__(self, beta: float, d: int | None = None):
    if not 0 <= beta < 1:
      raise ValueError(f'worker momentum needs beta in [0, 1), got {beta}.')
    self.beta, self.d = beta, d
    self.row_size = d or 0

  def bind(self, d: int) -> 'WorkerMomentum':
    return WorkerMomentum(self.beta, d)

  def encode(self, state, x, weights, rows, seeds):
    m = self.beta * rows + (1.0 - self.beta) * x
    return base.Encoded(m, weights, m, {})
