"""How a labelled array is split among clients: label-sorted or shuffled shards
(Karimireddy, He and Jaggi 2022's non-IID partition and its IID control) and label
proportions drawn from a Dirichlet(alpha) (Hsu, Qi and Brown 2019), whose
concentration is the heterogeneity knob: alpha -> 0 gives each client few labels,
alpha -> infinity the population's proportions."""

import numpy as np

SHARDS = ('sorted', 'iid')


def shards(
  labels: np.ndarray, num_clients: int, partition: str, rng: np.random.Generator
) -> list[np.ndarray]:
  """Indices of each client's examples: sorted by label (stable, 'sorted') or shuffled
  ('iid'), then cut into `num_clients` contiguous shards of near-equal size."""
  order = (
    np.argsort(labels, kind='stable') if partition == 'sorted' else rng.permutation(len(labels))
  )
  return np.array_split(order, num_clients)


def dirichlet(
  labels: np.ndarray, num_clients: int, alpha: float, rng: np.random.Generator
) -> list[np.ndarray]:
  """Indices per client: each label's examples split among the clients in proportions
  ~ Dirichlet(alpha), seeded; every example once, no client empty (one example lent
  from the largest)."""
  classes = np.unique(labels)
  proportions = rng.dirichlet(alpha * np.ones(num_clients), size=len(classes))
  parts: list[list[int]] = [[] for _ in range(num_clients)]
  for c, share in zip(classes, proportions):
    idx = rng.permutation(np.flatnonzero(labels == c))
    cuts = (np.cumsum(share)[:-1] * len(idx)).astype(int)
    for client, chunk in enumerate(np.split(idx, cuts)):
      parts[client].extend(chunk)
  for client in range(num_clients):
    if not parts[client]:
      donor = max(range(num_clients), key=lambda i: len(parts[i]))
      parts[client].append(parts[donor].pop())
  return [np.array(sorted(p)) for p in parts]
