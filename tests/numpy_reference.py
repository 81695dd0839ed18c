"""Independent NumPy implementations of the spec's update rules (the project spec of each
algorithm).

Linear regression y ~ <w, x> + b with loss 0.5 mean squared error; weights are
(kernel, bias). Batches follow dataset.batch(batch_size) with one local epoch.
"""

import numpy as np


def gradient(w, b, x, y):
  r = x @ w + b - y
  return x.T @ r / len(y), np.mean(r)


def batches(x, y, batch_size):
  for i in range(0, len(y), batch_size):
    yield x[i : i + batch_size], y[i : i + batch_size]


def soft_threshold(v, t):
  return np.sign(v) * np.maximum(np.abs(v) - t, 0)


def fedmid_round(w, b, clients, *, lr_c, lr_s, lam, batch_size, client_prox=True):
  """FedMiD (or -OSP) with the uniform mean; returns new (w, b)."""
  deltas, lr_sums = [], []
  for x, y in clients:
    cw, cb, lr_sum = w.copy(), b, 0.0
    for xb, yb in batches(x, y, batch_size):
      gw, gb = gradient(cw, cb, xb, yb)
      cw, cb = cw - lr_c * gw, cb - lr_c * gb
      if client_prox:
        cw = soft_threshold(cw, lr_c * lam)
      lr_sum += lr_c
    deltas.append((cw - w, cb - b))
    lr_sums.append(lr_sum)
  dw = np.mean([d[0] for d in deltas], axis=0)
  db = np.mean([d[1] for d in deltas])
  step = lr_s * np.mean(lr_sums)
  return soft_threshold(w + lr_s * dw, step * lam), b + lr_s * db


def feddualavg_round(z, zb, elapsed, clients, *, lr_c, lr_s, lam, batch_size, client_prox=True):
  """FedDualAvg (or -OSP); returns (z, zb, elapsed, primal w, primal b)."""
  deltas, lr_sums = [], []
  for x, y in clients:
    cz, czb, own = z.copy(), zb, 0.0
    for xb, yb in batches(x, y, batch_size):
      cw = soft_threshold(cz, (elapsed + own) * lam) if client_prox else cz
      gw, gb = gradient(cw, czb, xb, yb)
      cz, czb = cz - lr_c * gw, czb - lr_c * gb
      own += lr_c
    deltas.append((cz - z, czb - zb))
    lr_sums.append(own)
  z = z + lr_s * np.mean([d[0] for d in deltas], axis=0)
  zb = zb + lr_s * np.mean([d[1] for d in deltas])
  elapsed = elapsed + lr_s * np.mean(lr_sums)
  return z, zb, elapsed, soft_threshold(z, elapsed * lam), zb


def shifted_clients(seed: int, sizes_and_shifts, dim: int):
  """Heterogeneous linear-regression clients: client k holds n_k examples with features
  and targets shifted by s_k, for each (n_k, s_k) in `sizes_and_shifts`."""
  rng = np.random.default_rng(seed)
  out = []
  for n, shift in sizes_and_shifts:
    x = (rng.normal(size=(n, dim)) + shift).astype(np.float32)
    out.append((x, (x @ rng.normal(size=dim) + shift).astype(np.float32)))
  return out


def nnm(x: np.ndarray, f: int) -> np.ndarray:
  """Allouah et al. 2023, Algorithm 1: each row the mean of its m - f nearest (itself
  included; ties by position), by Euclidean distance in float64."""
  m = len(x)
  k = max(m - f, 1)
  out = np.empty_like(x)
  for i in range(m):
    d = np.linalg.norm(x.astype(np.float64) - x[i].astype(np.float64), axis=1)
    out[i] = x[np.argsort(d, kind='stable')[:k]].mean(0)
  return out


def krum_scores(x: np.ndarray, f: int) -> np.ndarray:
  """Krum's scores (Blanchard et al. 2017) by explicit differences: each row's summed
  squared distances to its m - f - 2 nearest others (at least one)."""
  dist = ((x[:, None, :] - x[None, :, :]) ** 2).sum(-1)
  k = max(len(x) - f - 2, 1)
  return np.array([np.sort(np.delete(dist[i], i))[:k].sum() for i in range(len(x))])


def krum_chosen(x: np.ndarray, f: int, select: int) -> np.ndarray:
  """The `select` rows (Multi-Krum; 1: Krum) of lowest score, ties by position."""
  return np.argsort(krum_scores(x, f), kind='stable')[:select]


def bulyan_chosen(x: np.ndarray, f: int) -> list[int]:
  """Bulyan's theta = m - 2f rows (El Mhamdi et al. 2018): Krum's choice one at a time
  among the rows left."""
  left, chosen = list(range(len(x))), []
  while len(chosen) < max(len(x) - 2 * f, 1):
    k = max(len(left) - f - 2, 1)
    scores = []
    for i in left:
      others = sorted(((x[i] - x[j]) ** 2).sum() for j in left if j != i)
      scores.append(sum(others[:k]))
    best = left[int(np.argmin(scores))]
    chosen.append(best)
    left.remove(best)
  return chosen
