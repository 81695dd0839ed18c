"""Aggregators: `tff.aggregators` factories for client updates."""

import tensorflow_federated as tff


def dual_state_mean() -> tff.aggregators.WeightedAggregationFactory:
  """FedDualAvg's dual-state mean: the weighted mean of the clients' dual deltas.

  Applied to `ElapsedUpdate(delta, lr_sum)` it averages both the dual deltas
  z_r - z_K^m and the step-size sums, so the server's elapsed coefficient grows by
  eta_s mean_m(sum eta_c). Weights come from the client work (1 for the paper's
  uniform mean). It is TFF's MeanFactory: averaging is linear in the dual, which is
  exactly why dual averaging keeps sparsity that primal averaging loses.
  """
  return tff.aggregators.MeanFactory()
