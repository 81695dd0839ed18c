"""Bulyan (`ops.aggregators.Bulyan`) against a NumPy reference written from the paper
(El Mhamdi et al. 2018): Krum's choices one at a time, then each coordinate's values
nearest its median averaged; and in a chain a round runs."""

import numpy as np
import pytest
import tensorflow as tf

from tests import numpy_reference
import tff_comp.ops.aggregators as agg


def _reference(x: np.ndarray, f: int) -> np.ndarray:
  s = x[sorted(numpy_reference.bulyan_chosen(x, f))]
  beta = max(len(s) - 2 * f, 1)
  median = np.median(s, axis=0)
  out = np.empty(x.shape[1])
  for j in range(x.shape[1]):
    nearest = np.argsort(np.abs(s[:, j] - median[j]), kind='stable')[:beta]
    out[j] = s[nearest, j].mean()
  return out


def _bulyan(x: np.ndarray, f: int) -> tuple[np.ndarray, dict]:
  chain = agg.Chain((), agg.Bulyan(f)).bind(x.shape[1])
  m = len(x)
  update, _, _, measured = chain.aggregate(
    chain.initial_state(),
    tf.constant(x),
    tf.ones([m]),
    tf.zeros([m, 0]),
    tf.zeros([m, 2], tf.int64),
    tf.zeros([2], tf.int64),
  )
  return np.asarray(update), measured


@pytest.mark.parametrize('m, f', [(11, 2), (15, 3), (8, 1), (5, 0), (7, 2)])
def test_bulyan_is_the_papers_rule(m, f):
  rng = np.random.default_rng(m * 10 + f)
  x = (rng.normal(size=(m, 13)) * rng.uniform(0.2, 3.0, size=(m, 1))).astype(np.float32)
  got, measured = _bulyan(x, f)
  np.testing.assert_allclose(got, _reference(x.astype(np.float64), f), rtol=1e-5, atol=1e-6)
  assert float(measured['bulyan_selected']) == max(m - 2 * f, 1)


def test_bulyan_leaves_out_far_attackers_and_is_the_mean_without_any():
  rng = np.random.default_rng(3)
  honest = rng.normal(size=(9, 6)).astype(np.float32)
  attacked = np.concatenate([honest, np.full((2, 6), 100.0, np.float32)])
  got, _ = _bulyan(attacked, 2)
  assert np.abs(got).max() < 3.0  # the rows at 100 changed nothing that far
  np.testing.assert_allclose(_bulyan(honest, 0)[0], honest.mean(0), rtol=1e-5)
