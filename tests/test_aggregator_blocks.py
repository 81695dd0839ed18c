"""The aggregator blocks (`ops.aggregators`, pure TF) against independent references
written plainly in NumPy and SciPy: every combiner and stage, the chain's composition
equal to its parts applied by hand, decomposable sums equal across shares, and the
refusal of a chain that cannot work."""

import math

import numpy as np
import pytest
import scipy.linalg
import scipy.stats
import tensorflow as tf

from tests import numpy_reference
import tff_comp.ops.aggregators as agg

RNG = np.random.default_rng(7)
M, D = 9, 12
X = RNG.normal(size=(M, D)).astype(np.float32) * RNG.uniform(0.2, 3.0, size=(M, 1)).astype(
  np.float32
)
W = RNG.integers(1, 20, size=M).astype(np.float32)
SEEDS = np.stack([np.full(M, 11), np.arange(M) + 100], 1).astype(np.int64)
ROUND_SEED = np.array([11, 3], np.int64)


def _aggregate(chain, x=X, w=W, seeds=SEEDS, state=None, rows=None):
  chain = chain.bind(x.shape[1])
  state = chain.initial_state() if state is None else state
  rows = np.zeros((len(x), chain.row_size), np.float32) if rows is None else rows
  update, new_rows, new_state, measured = chain.aggregate(
    state,
    tf.constant(x),
    tf.constant(w),
    tf.constant(rows),
    tf.constant(seeds),
    tf.constant(ROUND_SEED),
  )
  return np.asarray(update), np.asarray(new_rows), new_state, measured


# --- combiners --------------------------------------------------------------------


def test_mean_is_the_weighted_mean_and_dps_sum_over_n():
  np.testing.assert_allclose(
    _aggregate(agg.Chain((), agg.Mean()))[0], W @ X / W.sum(), rtol=1e-5, atol=1e-6
  )
  np.testing.assert_allclose(
    _aggregate(agg.Chain((), agg.Mean(denominator=20.0)))[0], X.sum(0) / 20.0, rtol=1e-5
  )
  zero = _aggregate(agg.Chain((), agg.Mean()), w=np.zeros(M, np.float32))[0]
  np.testing.assert_array_equal(zero, 0.0)  # no examples: no update, as TFF's no_nan mean


@pytest.mark.parametrize('m', [M, M - 1])
def test_median_is_numpys(m):
  got = _aggregate(agg.Chain((), agg.Median()), x=X[:m], w=W[:m], seeds=SEEDS[:m])[0]
  np.testing.assert_allclose(got, np.median(X[:m], axis=0), rtol=1e-6)


@pytest.mark.parametrize('beta', [0.0, 0.1, 0.25, 0.49])
def test_trimmed_mean_is_scipys(beta):
  got = _aggregate(agg.Chain((), agg.TrimmedMean(beta)))[0]
  np.testing.assert_allclose(got, scipy.stats.trim_mean(X, beta, axis=0), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('beta', [0.05, 0.1, 0.15, 0.3, 0.35, 0.49])
def test_a_trimmed_means_fewest_rows_are_the_fewest_it_trims(beta):
  """min_rows: the least m at which `combine` drops a value (one fewer: the mean)."""
  combiner = agg.TrimmedMean(beta)
  m = combiner.min_rows()[0]
  x = np.random.default_rng(0).normal(size=(m, 3)).astype(np.float32)
  for rows, trims in ((m, True), (m - 1, False)):
    got = combiner.combine(combiner.initial_state(), tf.constant(x[:rows]), tf.ones([rows]))[0]
    is_the_mean = np.allclose(got, x[:rows].mean(0), atol=1e-6)
    assert is_the_mean != trims, (rows, got)


def _krum_reference(x, f, select):
  return x[numpy_reference.krum_chosen(x, f, select)].mean(0)


@pytest.mark.parametrize('f, select', [(0, 1), (2, 1), (2, 4), (3, M)])
def test_krum_and_multi_krum_are_the_brute_force_scores(f, select):
  got = _aggregate(agg.Chain((), agg.Krum(f, select)))[0]
  np.testing.assert_allclose(got, _krum_reference(X.astype(np.float64), f, select), rtol=1e-4)


def test_geometric_median_minimizes_the_sum_of_distances():
  """The smoothed Weiszfeld result against scipy's minimizer of sum_i ||v - x_i||."""
  got = _aggregate(agg.Chain((), agg.GeometricMedian(iters=200, nu=1e-8)))[0]

  def objective(v):
    return np.linalg.norm(X - v, axis=1).sum()

  best = scipy.optimize.minimize(
    objective, X.mean(0), method='Nelder-Mead', options=dict(maxiter=200000, xatol=1e-9, fatol=1e-9)
  ).x
  assert objective(got) <= objective(best) + 1e-4
  assert objective(got) < objective(X.mean(0)) - 1e-3  # not the mean


def test_centered_clip_is_the_iteration_from_the_previous_result():
  chain = agg.Chain((), agg.CenteredClip(tau=0.7, iters=2)).bind(D)
  first, _, state, _ = _aggregate(chain)
  second, *_ = _aggregate(chain, state=state)
  v = np.zeros(D)
  for _ in range(2):
    for _ in range(2):
      diff = X - v
      v = v + (diff * np.minimum(1, 0.7 / np.linalg.norm(diff, axis=1))[:, None]).mean(0)
    if _ == 0:
      np.testing.assert_allclose(first, v, rtol=1e-5)
  np.testing.assert_allclose(second, v, rtol=1e-5)


def test_majority_vote_is_the_sign_of_the_signs_scaled_by_the_mean_scale():
  got = _aggregate(agg.Chain((agg.Sign(),), agg.MajorityVote()))[0]
  scales = np.abs(X).mean(1)
  np.testing.assert_allclose(got, scales.mean() * np.sign(np.sign(X).sum(0)), rtol=1e-5)


# --- norm bounds ------------------------------------------------------------------


def test_clip_is_tfs_clip_by_global_norm_with_tffs_measurements():
  got, _, _, measured = _aggregate(agg.Chain((agg.Clip(1.5),), agg.Mean()))
  clipped = np.stack([tf.clip_by_global_norm([row], 1.5)[0][0] for row in X])
  np.testing.assert_allclose(got, W @ clipped / W.sum(), rtol=1e-5)
  norms = np.linalg.norm(X, axis=1)
  assert int(measured['clipped_count']) == (norms > 1.5).sum()
  np.testing.assert_allclose(measured['mean_update_norm'], norms.mean(), rtol=1e-5)


def test_adaptive_bounds_follow_the_geometric_quantile_update():
  quantile = agg.Quantile(target=0.3, learning_rate=0.5, multiplier=2.0, increment=1.0)
  chain = agg.Chain((agg.Zeroing(1.0, order=2.0, adaptive=quantile),), agg.Mean()).bind(D)
  estimate, norms = 1.0, np.linalg.norm(X, axis=1)
  state = chain.initial_state()
  for _ in range(3):
    bound = 2 * estimate + 1
    got, _, state, measured = _aggregate(chain, state=state)
    zeroed = norms > bound
    np.testing.assert_allclose(got, W @ np.where(zeroed[:, None], 0, X) / W.sum(), rtol=1e-5)
    assert int(measured['zeroed_count']) == zeroed.sum()
    fraction = (norms <= estimate).mean()
    estimate *= math.exp(-0.5 * (fraction - 0.3))
    np.testing.assert_allclose(float(state.stages[0]), estimate, rtol=1e-5)


def test_a_dp_quantiles_count_centres_on_the_clients_present():
  """TFF's QuantileEstimatorQuery: each present client reports [norm <= E] - 1/2, their
  sum normalized by the expected clients n, plus 1/2: with 3 of 5 present clients below
  and n = 10, b = (3 - 5/2) / 10 + 1/2 = 0.55 (centring on n would give 0.3)."""
  quantile = agg.Quantile(target=0.5, learning_rate=0.4, denominator=10.0)
  got = quantile.next(
    tf.constant(2.0), tf.constant(3.0), tf.constant(5.0), tf.constant([1, 2], tf.int64)
  )
  np.testing.assert_allclose(float(got), 2.0 * math.exp(-0.4 * (0.55 - 0.5)), rtol=1e-6)


def test_zeroing_defaults_to_the_inf_norm_and_zeroes_non_finite_rows():
  x = X.copy()
  x[2, 3] = np.nan
  got, *_ = _aggregate(agg.Chain((agg.Zeroing(2.0),), agg.Mean()), x=x)
  keep = (np.abs(np.nan_to_num(x)).max(1) <= 2.0) & np.isfinite(x).all(1)
  np.testing.assert_allclose(got, W @ np.where(keep[:, None], x, 0) / W.sum(), rtol=1e-5)


def test_the_gaussian_mechanism_adds_z_c_noise_to_the_sum():
  draws = []
  for r in range(200):
    chain = agg.Chain((agg.Clip(0.5, noise_multiplier=2.0),), agg.Mean(denominator=M)).bind(D)
    update, *_ = chain.aggregate(
      chain.initial_state(),
      tf.constant(X),
      tf.constant(W),
      tf.zeros([M, 0]),
      tf.constant(SEEDS),
      tf.constant([11, r], tf.int64),
    )
    draws.append(np.asarray(update))
  clipped = np.stack([tf.clip_by_global_norm([row], 0.5)[0][0] for row in X])
  noise = (np.stack(draws) - clipped.sum(0) / M) * M  # back to the sum's scale
  sigma, count = 2.0 * 0.5, noise.size
  assert abs(noise.mean()) < 5 * sigma / math.sqrt(count)
  assert abs(noise.std() / sigma - 1) < 5 / math.sqrt(2 * count)


def test_the_gaussian_mechanism_before_a_median_is_refused():
  with pytest.raises(ValueError, match='noises a sum .* the median combiner is not one'):
    agg.Chain((agg.Clip(1.0, noise_multiplier=1.0),), agg.Median())


# --- compression ------------------------------------------------------------------


def _over_seeds(chain, n):
  return np.stack([_aggregate(chain, seeds=SEEDS + np.array([0, 1000 * s]))[0] for s in range(n)])


def _encodings(chain, n):
  """[n, M, D]: the cohort's rows encoded under n seeds."""
  return np.stack(
    [
      chain.encode(
        chain.initial_state(),
        tf.constant(X),
        tf.constant(W),
        tf.zeros([M, 0]),
        tf.constant(SEEDS + np.array([0, 1000 * s])),
      ).values.numpy()
      for s in range(n)
    ]
  )


@pytest.mark.parametrize('bits', [1, 2, 8])
def test_quantization_is_unbiased_on_its_grid(bits):
  chain = agg.Chain((agg.Quantize(bits),), agg.Mean()).bind(D)
  encoded = _encodings(chain, 400)
  lo, hi = X.min(1, keepdims=True), X.max(1, keepdims=True)
  step = (hi - lo) / (2**bits - 1)
  levels = (encoded - lo) / step
  np.testing.assert_allclose(levels, np.round(levels), atol=1e-3)  # on the 2^b levels
  assert np.all(np.abs(encoded - X) <= step + 1e-5)
  # Each client's value on average (a draw's spread is at most half a step).
  assert np.all(np.abs(encoded.mean(0) - X) <= 5 * (step / 2) / math.sqrt(400) + 1e-6)
  assert chain.upload_bits(D) == bits * D + 64


def test_qsgd_is_unbiased_on_its_levels():
  chain = agg.Chain((agg.QSGD(4),), agg.Mean()).bind(D)
  encoded = chain.encode(
    chain.initial_state(), tf.constant(X), tf.constant(W), tf.zeros([M, 0]), tf.constant(SEEDS)
  ).values.numpy()
  norms = np.linalg.norm(X, axis=1, keepdims=True)
  levels = np.abs(encoded) / norms * 4
  np.testing.assert_allclose(levels, np.round(levels), atol=1e-4)
  np.testing.assert_array_equal(np.sign(encoded)[encoded != 0], np.sign(X)[encoded != 0])
  mean = _over_seeds(chain, 300).mean(0)
  np.testing.assert_allclose(mean, W @ X / W.sum(), atol=4 * norms.max() / 4 / math.sqrt(300))


def test_top_k_keeps_the_largest_and_rand_k_is_unbiased():
  chain = agg.Chain((agg.TopK(0.25),), agg.Mean()).bind(D)
  k = 3
  kept = np.zeros_like(X)
  for i, row in enumerate(X):
    top = np.argsort(-np.abs(row))[:k]
    kept[i, top] = row[top]
  np.testing.assert_allclose(_aggregate(chain)[0], W @ kept / W.sum(), rtol=1e-5)
  assert chain.upload_bits(D) == k * (32 + 4)
  rand = agg.Chain((agg.RandK(0.25),), agg.Mean()).bind(D)
  encoded = rand.encode(
    rand.initial_state(), tf.constant(X), tf.constant(W), tf.zeros([M, 0]), tf.constant(SEEDS)
  ).values.numpy()
  assert ((encoded != 0).sum(1) == k).all()
  np.testing.assert_allclose(encoded[encoded != 0], (X * D / k)[encoded != 0], rtol=1e-5)
  mean = _over_seeds(rand, 400).mean(0)
  assert np.abs(mean - W @ X / W.sum()).max() < 0.25 * np.abs(X).max()


@pytest.mark.parametrize('size', [1, 2, 8, 2**11, 2**13])  # 2^13: three Kronecker factors
def test_the_rotation_is_hadamards_and_comes_back_at_the_server(size):
  x = np.random.default_rng(size).normal(size=(3, size)).astype(np.float32)
  np.testing.assert_allclose(
    agg.compression.hadamard(tf.constant(x)).numpy(),
    x @ scipy.linalg.hadamard(size).T / math.sqrt(size),
    rtol=1e-5,
    atol=3e-6,
  )
  got, _, state, _ = _aggregate(agg.Chain((agg.Rotate(),), agg.Mean()))
  np.testing.assert_allclose(got, W @ X / W.sum(), rtol=1e-4, atol=1e-6)  # padded 12 -> 16
  assert (
    agg.Chain((agg.Rotate(), agg.Quantize(8)), agg.Mean()).bind(D).upload_bits(D) == 8 * 16 + 64
  )
  seed, signs = state.stages[0]
  assert int(seed[1]) == 1  # a fresh rotation next round, its signs drawn by the server
  np.testing.assert_array_equal(signs, tf.sign(tf.random.stateless_uniform([16], seed) - 0.5))


def test_error_feedback_keeps_each_clients_residual():
  chain = agg.Chain((agg.ErrorFeedback(agg.TopK(0.25)),), agg.Mean()).bind(D)
  rows, residual = np.zeros((M, D), np.float32), np.zeros((M, D))
  state = chain.initial_state()
  for _ in range(3):
    got, rows, state, _ = _aggregate(chain, rows=rows, state=state)
    p = X + residual
    sent = np.zeros_like(p)
    for i, row in enumerate(p):
      top = np.argsort(-np.abs(row))[:3]
      sent[i, top] = row[top]
    residual = p - sent
    np.testing.assert_allclose(got, W @ sent / W.sum(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(rows, residual, rtol=1e-5, atol=1e-6)


def test_ef21_tracks_each_client_and_the_servers_estimate():
  chain = agg.Chain((agg.ErrorFeedback(agg.TopK(0.25), 'ef21'),), agg.Mean()).bind(D)
  rows, g_i, g = np.zeros((M, D), np.float32), np.zeros((M, D)), np.zeros(D)
  state = chain.initial_state()
  for _ in range(3):
    got, rows, state, _ = _aggregate(chain, rows=rows, state=state)
    diff = X - g_i
    c = np.zeros_like(diff)
    for i, row in enumerate(diff):
      top = np.argsort(-np.abs(row))[:3]
      c[i, top] = row[top]
    g_i, g = g_i + c, g + W @ c / W.sum()
    np.testing.assert_allclose(rows, g_i, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got, g, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('variant', ['ef', 'ef21'])
@pytest.mark.parametrize(
  'compressor',
  [agg.TopK(0.1), agg.Sign(), agg.RandK(0.1, unbiased=False)],
  ids=['top_k', 'sign', 'rand_k_unscaled'],
)
def test_error_feedbacks_residual_stays_bounded_with_a_contractive_compressor(variant, compressor):
  """A fresh N(0, 1) update each of 300 rounds: with delta-contraction, EF's residual
  stays below sqrt(1 - delta) / (1 - sqrt(1 - delta)) times the largest update (the
  geometric series of ||e_t|| <= sqrt(1 - delta) (||e_{t-1}|| + ||x_t||)), EF21's
  tracker error below it too; k/d = 1/10 and 1/d (sign) bound delta from below. A
  worst-case bound for top-k and sign; for rand-k its expectation, met with room."""
  d, m = 40, 3
  delta = 1.0 / d if isinstance(compressor, agg.Sign) else 0.1
  chain = agg.Chain((agg.ErrorFeedback(compressor, variant),), agg.Mean()).bind(d)
  rng = np.random.default_rng(5)
  rows, state, largest, worst = np.zeros((m, d), np.float32), chain.initial_state(), 0.0, 0.0
  for t in range(300):
    x = rng.normal(size=(m, d)).astype(np.float32)
    seeds = np.stack([np.full(m, 3), np.arange(m) + 10 * t], 1).astype(np.int64)
    _, rows, state, _ = _aggregate(
      chain, x=x, w=np.ones(m, np.float32), seeds=seeds, state=state, rows=rows
    )
    largest = max(largest, float(np.linalg.norm(x, axis=1).max()))
    tracked = x - rows if variant == 'ef21' else rows  # EF21: x - g_i; EF: e_i
    worst = max(worst, float(np.linalg.norm(tracked, axis=1).max()))
  q = math.sqrt(1.0 - delta)
  assert worst <= q / (1.0 - q) * largest, (worst, largest)


@pytest.mark.parametrize(
  'compressor', [agg.RandK(0.1), agg.QSGD(4), agg.Quantize(1)], ids=['rand_k', 'qsgd', 'quantize']
)
def test_error_feedback_refuses_a_compressor_that_is_not_contractive(compressor):
  """rand_k scaled by d/k, QSGD and 1-bit quantization: residual norms of 1e3-1e12."""
  with pytest.raises(ValueError, match='needs a contractive compressor'):
    agg.ErrorFeedback(compressor)


# --- secure aggregation -----------------------------------------------------------


def test_secure_sum_is_integer_arithmetic_modulo_its_bits():
  bound, bits = 20.0, 12
  got, _, _, measured = _aggregate(agg.Chain((), agg.SecureSum(bound, bits)))
  v = np.clip(X * W[:, None], -bound, bound).astype(np.float64)
  q = np.round((v + bound) * (2**bits - 1) / (2 * bound)).astype(np.int64)
  want = (q.sum(0) * 2 * bound / (2**bits - 1) - M * bound) / W.sum()
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  step = 2 * bound / (2**bits - 1)  # the quantization's, half of it a client at most
  assert np.abs(got - v.sum(0) / W.sum()).max() <= M * step / 2 / W.sum() + 1e-6
  assert float(measured['secure_wrapped']) == 0
  assert int(measured['secure_upper_clipped_count']) == (X * W[:, None] > bound).sum()
  narrow = agg.SecureSum(bound, bits, sum_bits=bits + 1)
  wrapped, _, _, measured = _aggregate(agg.Chain((), narrow))
  want_wrapped = ((q.sum(0) % 2 ** (bits + 1)) * 2 * bound / (2**bits - 1) - M * bound) / W.sum()
  np.testing.assert_allclose(wrapped, want_wrapped, rtol=1e-5, atol=1e-6)
  assert float(measured['secure_wrapped']) == (q.sum(0) >= 2 ** (bits + 1)).sum() > 0
  assert agg.Chain((), narrow).bind(D).upload_bits(D) == (bits + 1) * D


def test_the_default_modulus_holds_the_largest_sum_of_its_cohort():
  """b + ceil(log2 m) bits: ten clients at 0.9 of the bound sum to 10 (2^20 - 1) 0.95,
  which one bit fewer (23) wraps, the mean then -0.70."""
  secure = agg.SecureSum(1.0, 20, max_clients=10)
  assert secure.sum_bits == 24
  x = np.full((10, 3), 0.9, np.float32)
  got, _, _, measured = _aggregate(
    agg.Chain((), secure), x=x, w=np.ones(10, np.float32), seeds=SEEDS[:1].repeat(10, 0)
  )
  np.testing.assert_allclose(got, 0.9, atol=1e-5)
  assert float(measured['secure_wrapped']) == 0


@pytest.mark.parametrize(
  'stage, bits',
  [
    (agg.QSGD(16), (1 + math.log2(17)) * D + 32),  # a sign and log2(s + 1) bits a level
    (agg.QSGD(1), 2 * D + 32),
    (agg.RandK(0.25), 3 * 32),  # k values; the indices follow from the shared seed
    (agg.TopK(0.25), 3 * (32 + 4)),  # k values and their log2 d = 4-bit indices
    (agg.Sign(), D + 32),  # a bit a value and the scale
  ],
  ids=['qsgd16', 'qsgd1', 'rand_k', 'top_k', 'sign'],
)
def test_each_compressors_upload_bits_are_its_papers(stage, bits):
  assert agg.Chain((stage,), agg.Mean()).bind(D).upload_bits(D) == pytest.approx(bits)


# --- attacks ----------------------------------------------------------------------


@pytest.mark.parametrize('kind', ['sign_flip', 'scaled', 'gaussian', 'alie'])
def test_attackers_are_drawn_by_client_and_send_their_attack(kind):
  kinds = {'sign_flip': agg.SignFlip, 'scaled': agg.Scaled, 'gaussian': agg.Gaussian}
  attack = kinds.get(kind, agg.ALIE)(0.4, scale=3.0)
  stream = SEEDS + np.array([0, 1_000_003])  # the chain's first stage's stream
  bad = np.array([tf.random.stateless_uniform([], seed).numpy() < 0.4 for seed in stream])
  assert 0 < bad.sum() < M
  chain = agg.Chain((attack,), agg.Mean()).bind(D)

  def sent_by(rows):  # a client's draw is its own, whatever cohort it is in
    return chain.encode(
      chain.initial_state(),
      tf.constant(X[rows]),
      tf.constant(W[rows]),
      tf.zeros([len(X[rows]), 0]),
      tf.constant(SEEDS[rows]),
    ).values.numpy()

  sent = sent_by(slice(None))
  if kind != 'alie':
    np.testing.assert_array_equal(sent[2:], sent_by(slice(2, None)))
  np.testing.assert_array_equal(sent[~bad], X[~bad])
  if kind == 'sign_flip':
    np.testing.assert_array_equal(sent[bad], -X[bad])
  elif kind == 'scaled':
    np.testing.assert_allclose(sent[bad], 3.0 * X[bad])
  elif kind == 'gaussian':
    assert abs(sent[bad].std() / 3.0 - 1) < 0.4
  else:
    honest = X[~bad]
    m, f = M, bad.sum()
    s = math.floor(m / 2 + 1) - f
    z = scipy.stats.norm.ppf((m - s) / m)
    np.testing.assert_allclose(
      sent[bad],
      np.broadcast_to(honest.mean(0) - z * honest.std(0), sent[bad].shape),
      rtol=1e-4,
      atol=1e-5,
    )
  assert float(_aggregate(chain)[3]['byzantine_clients']) == bad.sum()


def test_alie_with_a_given_z_sends_mu_minus_z_sigma():
  chain = agg.Chain((agg.ALIE(0.4, z=1.5),), agg.Mean()).bind(D)
  stream = SEEDS + np.array([0, 1_000_003])
  bad = np.array([tf.random.stateless_uniform([], seed).numpy() < 0.4 for seed in stream])
  sent = chain.encode(
    chain.initial_state(), tf.constant(X), tf.constant(W), tf.zeros([M, 0]), tf.constant(SEEDS)
  ).values.numpy()
  honest = X[~bad]
  expected = np.broadcast_to(honest.mean(0) - 1.5 * honest.std(0), sent[bad].shape)
  np.testing.assert_allclose(sent[bad], expected, rtol=1e-4, atol=1e-5)


# --- the chain --------------------------------------------------------------------


def test_a_chain_equals_its_stages_applied_by_hand():
  """Clip, then 4-bit quantization, then the weighted mean: the chain's result is each
  part's applied in turn (optax's test of a composition)."""
  chain = agg.Chain((agg.Clip(1.0), agg.Quantize(4)), agg.Mean()).bind(D)
  got = _aggregate(chain)[0]
  clip = agg.Chain((agg.Clip(1.0),), agg.Mean()).bind(D)
  clipped = clip.encode(
    clip.initial_state(), tf.constant(X), tf.constant(W), tf.zeros([M, 0]), tf.constant(SEEDS)
  ).values
  quantize = agg.Quantize(4)
  # The chain gives its second stage the second stream of each client's seed.
  stream = tf.constant(SEEDS) + tf.constant([0, 1_000_003], tf.int64) * 2
  quantized = quantize.encode((), clipped, tf.constant(W), tf.zeros([M, 0]), stream).values
  np.testing.assert_allclose(got, W @ quantized.numpy() / W.sum(), rtol=1e-5)


@pytest.mark.parametrize(
  'combiner', [agg.Mean(), agg.MajorityVote(), agg.SecureSum(50.0), agg.SecureSum(5.0, 8, 9)]
)
def test_decomposable_sums_of_shares_add_to_the_cohorts(combiner):
  """What Ray's actors and FedBuff's buffers rely on: the shares' sums, added, finish as
  the whole cohort's."""
  chain = agg.Chain((agg.Clip(2.0),), combiner).bind(D)
  state = chain.initial_state()

  def sums(rows):
    encoded = chain.encode(
      state,
      tf.constant(X[rows]),
      tf.constant(W[rows]),
      tf.zeros([len(rows), 0]),
      tf.constant(SEEDS[rows]),
    )
    return chain.sums(state, encoded)

  parts = [sums(np.arange(0, 4)), sums(np.arange(4, M))]
  added = tf.nest.map_structure(lambda a, b: a + b, *parts)
  whole = chain.finish(state, sums(np.arange(M)), tf.constant(ROUND_SEED))[0]
  np.testing.assert_allclose(
    chain.finish(state, added, tf.constant(ROUND_SEED))[0], whole, rtol=1e-5, atol=1e-6
  )
