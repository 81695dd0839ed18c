"""Scoring several models on one data matrix at once, equal to scoring each alone.

`x @ w` for T models reads `x` T times; where `x` outgrows the cache (lasso's 32 MB of
training examples) each read comes from memory. `products` reads `x` once, in blocks
of rows that stay in the cache while every model's product with them is taken, one
matrix-vector product a model and block. A block holds a multiple of `ROWS` rows:
BLAS's matrix-vector kernels take a matrix's rows in small groups, and with blocks
that start at a group's boundary every row is summed as in `x @ w`, so every model's
numbers are its own alone to the bit (`tests/test_lasso_task.py`; blocks of 3 rows
differ). A matrix product `x @ W` would be faster but sums in another order.
"""

from collections.abc import Sequence

import numpy as np

# A block's size: 256 rows of 1,024 float32 features are 1 MB, within a core's L2.
BLOCK_BYTES = 2**20
# A block's rows are a multiple of this (see the module docstring).
ROWS = 64


def products(x: np.ndarray, kernels: Sequence[np.ndarray]) -> np.ndarray:
  """[len(kernels), n]: row t is x @ kernels[t], for x [n, d] and kernels [d] each."""
  out = np.empty((len(kernels), x.shape[0]), np.result_type(x, *kernels))
  rows = max(1, BLOCK_BYTES // max(1, x[:1].nbytes) // ROWS) * ROWS
  for start in range(0, x.shape[0], rows):
    block = x[start : start + rows]
    for t, kernel in enumerate(kernels):
      np.matmul(block, kernel, out=out[t, start : start + rows])
  return out


def mean_squared_errors(
  x: np.ndarray, y: np.ndarray, kernels: Sequence[np.ndarray], biases: Sequence[float]
) -> list[float]:
  """Each linear model's mean of (x @ kernel + bias - y)^2, `x` read once for all. A
  diverged model's is inf (or nan), without NumPy's overflow warning: the run's
  divergence check says so in its own line."""
  with np.errstate(over='ignore', invalid='ignore'):
    return [
      float(np.mean((row + b - y) ** 2))
      for row, b in zip(products(x, kernels), biases, strict=True)
    ]
