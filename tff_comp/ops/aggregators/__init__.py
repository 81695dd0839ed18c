"""Aggregators as blocks (pure TensorFlow, no TFF): a chain of stages ending in a combiner
that turns a round's client updates into one (`base`: the contract).

    combiners    Mean (weighted; DP's sum over n), MajorityVote, Median, TrimmedMean,
                 Krum / Multi-Krum, GeometricMedian, CenteredClip; Bulyan (bulyan)
    robust       Clip (fixed or adaptive to a quantile; the Gaussian mechanism), Zeroing
    compression  Rotate, Quantize, QSGD, TopK, RandK, Sign, ErrorFeedback (EF, EF21)
    secure       SecureSum (TFF's secure aggregation, modular, with its wrap-around)
    tree         TreeNoise (DP-FTRL's tree aggregation: noise correlated across rounds)
    banded       BandedNoise (BandMF: noise correlated by a banded matrix factorization)
    attacks      Attack: Byzantine clients (SignFlip, Scaled, Gaussian, ALIE)
    ipm          InnerProductManipulation: -epsilon times the honest mean (Xie et al.)
    mimic        Mimic: every attacker copies one honest update (Karimireddy et al.)
    nnm          NearestNeighbourMixing: a pre-aggregation before a robust combiner
    bucketing    Bucketing: random buckets averaged, a pre-aggregation
    momentum     WorkerMomentum: each client sends its momentum across rounds

    import tff_comp.ops.aggregators as agg
    chain = agg.Chain((agg.Clip(1.0), agg.Quantize(8)), agg.Median())

docs/aggregators.md gives each one's math and reference.
"""

from tff_comp.ops.aggregators.attacks import ALIE, Attack, Gaussian, Scaled, SignFlip
from tff_comp.ops.aggregators.banded import BandedNoise
from tff_comp.ops.aggregators.base import (
  ROW_FIELDS,
  Chain,
  ChainState,
  Combiner,
  Encoded,
  PreAggregation,
  Stage,
  Sums,
  client_seeds,
  flatten,
  round_seed,
  unflatten,
)
from tff_comp.ops.aggregators.bucketing import Bucketing
from tff_comp.ops.aggregators.bulyan import Bulyan
from tff_comp.ops.aggregators.combiners import (
  CenteredClip,
  GeometricMedian,
  Krum,
  MajorityVote,
  Mean,
  Median,
  TrimmedMean,
)
from tff_comp.ops.aggregators.compression import (
  QSGD,
  ErrorFeedback,
  Quantize,
  RandK,
  Rotate,
  Sign,
  TopK,
)
from tff_comp.ops.aggregators.ipm import InnerProductManipulation
from tff_comp.ops.aggregators.mimic import Mimic
from tff_comp.ops.aggregators.momentum import WorkerMomentum
from tff_comp.ops.aggregators.nnm import NearestNeighbourMixing
from tff_comp.ops.aggregators.robust import Clip, Quantile, Zeroing
from tff_comp.ops.aggregators.secure import SecureSum
from tff_comp.ops.aggregators.tree import TreeNoise

__all__ = [
  'ALIE',
  'Attack',
  'BandedNoise',
  'Bucketing',
  'Bulyan',
  'CenteredClip',
  'Chain',
  'ChainState',
  'Clip',
  'Combiner',
  'Encoded',
  'Gaussian',
  'ErrorFeedback',
  'GeometricMedian',
  'InnerProductManipulation',
  'Mimic',
  'Krum',
  'MajorityVote',
  'Mean',
  'Median',
  'NearestNeighbourMixing',
  'PreAggregation',
  'QSGD',
  'Quantile',
  'Quantize',
  'RandK',
  'Rotate',
  'Scaled',
  'SecureSum',
  'Sign',
  'SignFlip',
  'Stage',
  'Sums',
  'ROW_FIELDS',
  'TopK',
  'TreeNoise',
  'TrimmedMean',
  'WorkerMomentum',
  'Zeroing',
  'client_seeds',
  'flatten',
  'round_seed',
  'unflatten',
]
