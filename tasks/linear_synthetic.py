"""Shared recipe of the synthetic regression tasks (lasso, nuclear).

Client c draws a fixed mean mu_c ~ N(0, I) and samples x ~ N(mu_c, I);
y = <W*, x> + b* + eps with eps ~ N(0, noise^2). Deterministic from a SeedSequence.
"""

import numpy as np


def generate_clients(
  w_star: np.ndarray,
  streams: list[np.random.SeedSequence],
  examples_per_client: int,
  *,
  bias: float,
  noise: float,
) -> list[tuple[np.ndarray, np.ndarray]]:
  """One (x [n, *w_star.shape], y [n]) pair per seed stream, in float32."""
  clients = []
  for stream in streams:
    rng = np.random.default_rng(stream)
    mu = rng.normal(size=w_star.shape)
    x = (mu + rng.normal(size=(examples_per_client, *w_star.shape))).astype(np.float32)
    y = x.reshape(examples_per_client, -1) @ w_star.reshape(-1)
    y = (y + bias + noise * rng.normal(size=examples_per_client)).astype(np.float32)
    clients.append((x, y))
  return clients
