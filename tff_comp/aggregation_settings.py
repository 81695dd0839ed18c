"""The run's aggregation beyond the mean: a robust combiner (`--aggregator`, in
`privacy_settings.PrivacyOptions`, names it), compression, secure aggregation and
simulated attackers, assembled into the aggregator chain every in-process runtime runs
(`ops.aggregators`; docs/aggregators.md):

    [attack] -> [zeroing] -> [clip | DP clip] -> [rotation] -> [compression, error feedback]
    -> combiner: mean (DP: sum / n) | a robust one | majority vote (sign) | secure sum
"""

import dataclasses

from tff_comp import poisoning, settings
from tff_comp.ops import aggregators
from tff_comp.ops.aggregators import attacks

ROBUST = (
  'median',
  'trimmed_mean',
  'krum',
  'multi_krum',
  'bulyan',
  'geometric_median',
  'centered_clip',
)
COMPRESSIONS = ('none', 'quantize', 'qsgd', 'top_k', 'rand_k', 'sign')
ERROR_FEEDBACK = ('none', 'ef', 'ef21')
ATTACKS = ('none', *attacks.KINDS, poisoning.KIND)


@dataclasses.dataclass(frozen=True)
class AggregationOptions:
  """Robust combiners' parameters, compression, secure aggregation, attackers."""

  trim_fraction: float = settings.setting(
    0.1,
    "--aggregator=trimmed_mean: the fraction of each coordinate's values dropped at each end.",
    lower=0.0,
    upper=0.49,
    applies_when={'aggregator': ('trimmed_mean',)},
    per_trial=True,
  )
  byzantine_clients: int = settings.setting(
    1,
    '--aggregator=krum/multi_krum/bulyan: the attackers f a round is assumed to have'
    " (Krum: each row's score sums its m - f - 2 nearest others; Bulyan: m - 2f rows"
    ' chosen, then 2f values a coordinate trimmed).',
    lower=0,
    upper=settings.MAX_COUNT,
    applies_when={'aggregator': ('krum', 'multi_krum', 'bulyan')},
    per_trial=True,
  )
  multi_krum_select: int | None = settings.setting(
    None,
    '--aggregator=multi_krum: rows of lowest score averaged (default m - f).',
    lower=1,
    upper=settings.MAX_COUNT,
    applies_when={'aggregator': ('multi_krum',)},
    per_trial=True,
  )
  geometric_median_iters: int = settings.setting(
    10,
    '--aggregator=geometric_median: smoothed Weiszfeld iterations.',
    lower=1,
    upper=1000,
    applies_when={'aggregator': ('geometric_median',)},
  )
  centered_clip_tau: float = settings.setting(
    1.0,
    "--aggregator=centered_clip: the radius tau around the previous round's result.",
    lower=settings.FLOAT32_TINY,
    upper=settings.FLOAT32_HUGE,
    applies_when={'aggregator': ('centered_clip',)},
    per_trial=True,
  )
  compression: str = settings.setting(
    'none',
    'What each client sends in fewer bits: quantize (stochastic b-bit,'
    ' --quantize_bits; --hadamard_rotation first), qsgd (--qsgd_levels), top_k and'
    " rand_k (--sparsity_fraction), sign (scaled signs; with --aggregator=mean, signSGD's"
    ' majority vote). comm/upload_bytes reports the bits.',
    choices=COMPRESSIONS,
  )
  quantize_bits: int = settings.setting(
    8,
    '--compression=quantize: bits a value.',
    lower=1,
    upper=16,
    applies_when={'compression': ('quantize',)},
  )
  hadamard_rotation: bool = settings.setting(
    False,
    '--compression=quantize: rotate each update by a randomized Hadamard'
    " transform first (TFF's compression; the server rotates back).",
    applies_when={'compression': ('quantize', 'top_k', 'rand_k')},
  )
  qsgd_levels: int = settings.setting(
    16,
    '--compression=qsgd: quantization levels s.',
    lower=1,
    upper=2**16,
    applies_when={'compression': ('qsgd',)},
  )
  sparsity_fraction: float = settings.setting(
    0.1,
    '--compression=top_k/rand_k: the fraction of coordinates sent.',
    above=0.0,
    upper=1.0,
    applies_when={'compression': ('top_k', 'rand_k')},
  )
  error_feedback: str = settings.setting(
    'none',
    'Error feedback around the compression: ef (Karimireddy et al. 2019) or ef21'
    " (Richtarik et al. 2021), a residual of the model's size kept per client"
    ' (in-process runtime). Needs a contractive compressor: top_k, sign, or rand_k'
    ' (then unscaled, not d/k); quantize and qsgd are refused.',
    choices=ERROR_FEEDBACK,
    applies_when={'compression': COMPRESSIONS[1:]},
  )
  secure_aggregation: bool = settings.setting(
    False,
    "Sum the updates as secure aggregation does (TFF's secure_aggregator): each"
    ' value clipped to +-(--secure_bound), mapped to --secure_bits integers, summed'
    ' modulo 2^(--secure_sum_bits).',
  )
  secure_bound: float = settings.setting(
    1.0,
    '--secure_aggregation: the bound r of each (weighted) value.',
    lower=settings.FLOAT32_TINY,
    upper=settings.FLOAT32_HUGE,
    applies_when={'secure_aggregation': (True,)},
  )
  secure_bits: int = settings.setting(
    20,
    "--secure_aggregation: bits of each value's integer.",
    lower=1,
    upper=32,
    applies_when={'secure_aggregation': (True,)},
  )
  secure_sum_bits: int | None = settings.setting(
    None,
    '--secure_aggregation: bits of the modulus (default: --secure_bits plus'
    ' log2 of the cohort, which never wraps; fewer wrap, counted in'
    ' train/aggregator/secure_wrapped).',
    lower=1,
    upper=62,
    applies_when={'secure_aggregation': (True,)},
  )
  attack: str = settings.setting(
    'none',
    'Byzantine clients, simulated: each client of a round attacks with'
    ' probability --attack_fraction, drawn from (seed, round, client), sending'
    ' sign_flip (-u), scaled (--attack_scale x u), gaussian (N(0, --attack_scale^2)) or'
    ' alie ("A Little Is Enough": mean - z std of the honest updates); or label_flip:'
    ' a fixed set of clients, drawn from (data seed, client), trains on labels'
    ' C - 1 - y.',
    choices=ATTACKS,
  )
  attack_fraction: float = settings.setting(
    0.1,
    '--attack: the chance that a client is an attacker.',
    lower=0.0,
    upper=1.0,
    applies_when={'attack': ATTACKS[1:]},
    per_trial=True,
  )
  attack_scale: float = settings.setting(
    1.0,
    "--attack=scaled/gaussian: the factor or the noise's std.",
    lower=settings.FLOAT32_TINY,
    upper=settings.FLOAT32_HUGE,
    applies_when={'attack': ('scaled', 'gaussian')},
    per_trial=True,
  )

  def __post_init__(self):
    settings.check(self)
    compressor = self._compressor()
    if self.error_feedback != 'none' and compressor is not None and not compressor.contractive:
      raise ValueError(
        f'--error_feedback={self.error_feedback} needs a contractive compressor, and'
        f' --compression={self.compression} is not (its residuals grow without bound):'
        ' use top_k, sign or rand_k.'
      )

  @property
  def active(self) -> bool:
    """Whether any of these settings changes the aggregation."""
    return (
      self.compression != 'none'
      or self.secure_aggregation
      or self.attack not in ('none', poisoning.KIND)  # label flipping poisons the data
    )

  def chain(
    self, aggregator: str, private: aggregators.Chain | None, clients_per_round: int
  ) -> aggregators.Chain:
    """The chain of `aggregator` (--aggregator: 'mean', a robust combiner) with these
    settings, around `private` (the chain of clip, dp or dp_adaptive, if one).

    Raises:
      ValueError: (one line) a combination that cannot work.
    """
    stages: list[aggregators.Stage] = []
    if self.attack not in ('none', poisoning.KIND):
      stages.append(aggregators.Attack(self.attack, self.attack_fraction, self.attack_scale))
    if private is not None:
      stages.extend(private.stages)
    compressor = self._compressor()
    if compressor is not None:
      if self.hadamard_rotation:
        stages.append(aggregators.Rotate())
      if self.error_feedback != 'none':
        compressor = aggregators.ErrorFeedback(compressor, self.error_feedback)
      stages.append(compressor)
    combiner = self._combiner(aggregator, private, clients_per_round)
    return aggregators.Chain(tuple(stages), combiner)

  def _compressor(self) -> aggregators.Stage | None:
    return {
      'none': lambda: None,
      'quantize': lambda: aggregators.Quantize(self.quantize_bits),
      'qsgd': lambda: aggregators.QSGD(self.qsgd_levels),
      'top_k': lambda: aggregators.TopK(self.sparsity_fraction),
      # Under error feedback, unscaled: contractive (module docstring of compression).
      'rand_k': lambda: aggregators.RandK(
        self.sparsity_fraction, unbiased=self.error_feedback == 'none'
      ),
      'sign': aggregators.Sign,
    }[self.compression]()

  def _check_cohort(self, aggregator: str, m: int) -> None:
    """ValueError (one line) for f or Multi-Krum's selection beyond what a cohort of m
    allows (a smaller cohort in a round, by dropouts or Poisson sampling, is clamped)."""
    if aggregator in _COHORT_NEEDED:
      a, b = _COHORT_NEEDED[aggregator]
      if m < a * self.byzantine_clients + b:
        raise ValueError(
          f'--aggregator={aggregator} with --byzantine_clients={self.byzantine_clients}'
          f' needs at least {a} f + {b} = {a * self.byzantine_clients + b} clients a round'
          f' (--clients_per_round={m}).'
        )
    if aggregator == 'multi_krum' and (self.multi_krum_select or 0) > m:
      raise ValueError(
        f'--multi_krum_select={self.multi_krum_select} is more rows than a round has'
        f' (--clients_per_round={m}).'
      )

  def _combiner(
    self, aggregator: str, private: aggregators.Chain | None, clients_per_round: int
  ) -> aggregators.Combiner:
    if aggregator in ROBUST:
      if self.secure_aggregation:
        raise ValueError(
          f"--aggregator={aggregator} needs each client's update, while"
          ' --secure_aggregation reveals only their total.'
        )
      f = self.byzantine_clients
      self._check_cohort(aggregator, clients_per_round)
      return {
        'median': aggregators.Median,
        'trimmed_mean': lambda: aggregators.TrimmedMean(self.trim_fraction),
        'krum': lambda: aggregators.Krum(f),
        'multi_krum': lambda: aggregators.Krum(
          f, self.multi_krum_select or max(1, clients_per_round - f)
        ),
        'bulyan': lambda: aggregators.Bulyan(f),
        'geometric_median': lambda: aggregators.GeometricMedian(self.geometric_median_iters),
        'centered_clip': lambda: aggregators.CenteredClip(self.centered_clip_tau),
      }[aggregator]()
    if self.secure_aggregation:
      if private is not None and not private.combiner.weighted:
        raise ValueError(
          '--secure_aggregation with a DP --aggregator is distributed DP,'
          ' which is not built yet; use --aggregator=clip or mean.'
        )
      return aggregators.SecureSum(
        self.secure_bound,
        self.secure_bits,
        self.secure_sum_bits,
        max_clients=max(clients_per_round, 2),
      )
    if self.compression == 'sign' and private is None:
      return aggregators.MajorityVote()
    return private.combiner if private is not None else aggregators.Mean()


# The smallest cohort each selection rule is defined for with f attackers (Blanchard et
# al. 2017: n > 2f + 2; El Mhamdi et al. 2018: n >= 4f + 3).
_COHORT_NEEDED = {'krum': (2, 3), 'multi_krum': (2, 3), 'bulyan': (4, 3)}


def upload_bytes(chain: aggregators.Chain | None, d: int, side_floats: int) -> float:
  """Bytes a client sends a round: its model part (the chain's bits, 32 a float without
  one) and its update's other fields (`side_floats` floats, exact)."""
  bits = 32.0 * d if chain is None else chain.upload_bits(d)
  return (bits + 32.0 * side_floats) / 8.0
