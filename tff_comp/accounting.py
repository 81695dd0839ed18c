"""Privacy accounting of a run's DP rounds with `dp_accounting` (installed with TFF).

Each round is one Gaussian mechanism of noise multiplier z on the clipped sum of the
sampled clients' updates (`ops.privacy`, TFF's DP factories), sampled as the run
samples its cohort:

    poisson           each of N clients with probability q = n / N: Poisson
                      subsampling (add-or-remove-one-client adjacency), the sampling
                      DP-FedAvg's analysis assumes (McMahan et al. 2018)
    uniform           n distinct clients of N: sampling without replacement, which the
                      RDP accountant covers for replace-one-client adjacency only (Wang,
                      Balle and Kasiviswanathan 2019); that epsilon is for a client's
                      data replaced, not removed, and is larger than the Poisson one
    with_replacement  not accounted (a client drawn twice adds 2C): refused

DP-FTRL's tree aggregation (`restart_every` k > 0) takes no sampling: with cyclic
participation each client is in at most one round of every tree of k <= E rounds (E the
rounds of an epoch, or the --min_separation), so each tree is dp_accounting's
`SingleEpochTreeAggregationDpEvent` (RDP alpha ceil(log2(k + 1)) / (2 z^2): the
client's update changes one node a level), trees composing (Kairouz et al. 2021,
appendix D), for a client's update replaced by zeros (replace-special adjacency).

BandMF (`bands` b > 0) takes no sampling either: with cyclic participation of epoch
E >= b (or --min_separation E >= b: 'separated'), a client's rounds are at least b
apart, so its k = ceil(t / E) rounds of the
first t change the b-banded factor's C x by at most sqrt(k) clip norms
(`ops.matrix_factorization`): the t rounds released are one Gaussian mechanism of noise
multiplier z / sqrt(k) (Choquette-Choo et al. 2023), replace-special adjacency.

Client dropout is not accounted: a data-independent dropout only removes contributions,
so the epsilon stated is an upper bound. For adaptive clipping z is the effective total
multiplier, covering the clipped-count query too (as TFF's `gaussian_adaptive`).
"""

from collections.abc import Callable
import dataclasses
import functools
import math

from absl import logging
import dp_accounting
from dp_accounting import pld, rdp
from scipy import optimize

from tff_comp.run import callbacks, outputs

ACCOUNTANTS = ('rdp', 'pld')
SAMPLINGS = ('poisson', 'uniform')
# Participation bounded in time, what a tree's and BandMF's accounting take: cyclic
# blocks, or uniform draws each client at most once in any `epoch` rounds
# (--min_separation).
BOUNDED = ('cyclic', 'separated')


@dataclasses.dataclass(frozen=True)
class Ledger:
  """The privacy spent by a run's rounds (see the module docstring).

  noise_multiplier: z; clients_per_round: n (expected, for Poisson); population: N;
  sampling: one of `SAMPLINGS`; delta: the run's delta; accountant: 'rdp' (fast, every
  round) or 'pld' (tighter, Poisson only, about 0.3 s a call); restart_every: k, the
  rounds of each tree of DP-FTRL's tree aggregation (0: a Gaussian mechanism a round);
  bands: b, BandMF's bands (0: not BandMF), with `epoch` E the rounds between a
  client's rounds (cyclic sampling's epoch).
  """

  noise_multiplier: float
  clients_per_round: int
  population: int
  sampling: str
  delta: float
  accountant: str = 'rdp'
  restart_every: int = 0
  bands: int = 0
  epoch: int = 0

  def __post_init__(self):
    check(
      self.sampling,
      self.accountant,
      self.delta,
      self.population,
      self.restart_every,
      bands=self.bands,
      epoch=self.epoch,
    )
    if self.noise_multiplier < 0:
      raise ValueError(f'noise_multiplier must be >= 0, got {self.noise_multiplier}.')

  @property
  def assumption(self) -> str:
    """One line: what the epsilon is a bound for."""
    if self.bands:
      return (
        f'accounting of BandMF with {self.bands} bands as a Gaussian mechanism, each client'
        f' in one round of every {self.epoch} ({_BOUNDED_BY[self.sampling]}),'
        f' replace-with-zeros adjacency, delta = {self.delta:.3g}'
      )
    if self.restart_every:
      return (
        f'RDP accounting of tree aggregation restarted every {self.restart_every} rounds,'
        f' each client in at most one round a tree ({_BOUNDED_BY[self.sampling]}),'
        f' replace-with-zeros adjacency, delta = {self.delta:.3g}'
      )
    if self.sampling == 'poisson':
      return (
        f'{self.accountant.upper()} accounting of Poisson sampling (q ='
        f' {self.clients_per_round}/{self.population}), add-or-remove-one-client'
        f' adjacency, delta = {self.delta:.3g}'
      )
    return (
      f'RDP accounting of sampling {self.clients_per_round} of {self.population}'
      " clients without replacement, replace-one-client adjacency (a client's"
      f' data replaced, not removed), delta = {self.delta:.3g}'
    )

  def epsilon(self, rounds: int) -> float:
    """Epsilon at `delta` after `rounds` rounds (inf for z = 0)."""
    if rounds <= 0:
      return 0.0
    if self.noise_multiplier == 0:
      return math.inf
    accountant = _fresh(self.sampling, self.accountant, bool(self.restart_every or self.bands))
    accountant.compose(_event(self, rounds))
    return accountant.get_epsilon(self.delta)

  def per_round(self) -> Callable[[int], float]:
    """rounds -> epsilon, fast enough to call every round: the RDP of a round is
    computed once and scaled by the rounds (RDP composes additively), then converted
    at `delta`; PLD recomposes on each call."""
    if self.accountant != 'rdp' or self.noise_multiplier == 0 or self.restart_every or self.bands:
      return self.epsilon  # a tree's and BandMF's RDP are closed forms
    accountant = _fresh(self.sampling, 'rdp')
    accountant.compose(_round_event(self))
    # The accountant's orders and one round's RDP at them (dp_accounting 0.4 keeps them
    # in these attributes; tests compare the result with `epsilon`).
    orders, one_round = accountant._orders, accountant._rdp

    def epsilon(rounds: int) -> float:
      if rounds <= 0:
        return 0.0
      return rdp.rdp_privacy_accountant.compute_epsilon(
        orders, [rounds * r for r in one_round], self.delta
      )[0]

    return epsilon

  def rounds_within(self, budget: float, most: int) -> int:
    """The most rounds (<= `most`) whose epsilon is at most `budget` (binary search:
    epsilon grows with the rounds)."""
    epsilon = self.per_round()
    low, high = 0, most
    while low < high:
      mid = (low + high + 1) // 2
      if epsilon(mid) <= budget:
        low = mid
      else:
        high = mid - 1
    return low


def check(
  sampling: str,
  accountant: str,
  delta: float,
  population: int,
  restart_every: int = 0,
  *,
  bands: int = 0,
  epoch: int = 0,
) -> None:
  """Raises ValueError (one line) for a run the accountant cannot account
  (`restart_every` > 0: DP-FTRL's trees; `bands` > 0: BandMF, `epoch` E rounds apart)."""
  if accountant not in ACCOUNTANTS:
    raise ValueError(f'accountant={accountant!r} is unknown; choose one of {ACCOUNTANTS}.')
  if bands:
    if sampling not in BOUNDED:
      raise ValueError(
        "BandMF's accounting assumes each client's rounds at least --bands apart"
        f' (--sampling=cyclic or --min_separation), not {sampling} sampling.'
      )
    if epoch < bands:
      raise ValueError(
        f"BandMF with {bands} bands needs a client's rounds at least {bands} apart;"
        f' here they are {epoch} apart: use --bands={epoch} or fewer.'
      )
    if accountant != 'rdp':
      raise ValueError('BandMF is accounted by the RDP accountant: --accountant=rdp.')
  elif restart_every:
    if sampling not in BOUNDED:
      raise ValueError(
        "tree aggregation's accounting assumes each client in at most one round of a"
        f' tree (--sampling=cyclic or --min_separation), not {sampling} sampling.'
      )
    if accountant != 'rdp':
      raise ValueError('tree aggregation is accounted by the RDP accountant: --accountant=rdp.')
  elif sampling in BOUNDED:
    raise ValueError(
      f'{"cyclic participation" if sampling == "cyclic" else "--min_separation"} amplifies'
      " no Gaussian round's privacy; use poisson or uniform sampling, or"
      ' --aggregator=dp_ftrl_tree or dp_bandmf.'
    )
  elif sampling not in SAMPLINGS:
    raise ValueError(
      f'sampling={sampling!r} cannot be accounted (a client drawn twice'
      ' adds its update twice); use poisson or uniform sampling.'
    )
  if sampling == 'uniform' and accountant == 'pld':
    raise ValueError(
      'the PLD accountant cannot account fixed-size sampling without'
      ' replacement; use --accountant=rdp or --sampling=poisson.'
    )
  if not 0 < delta < 1 / population:
    raise ValueError(
      f'target_delta must be in (0, 1/population = {1 / population:.3g}), got'
      f' {delta} (a delta of 1/population or more allows releasing a'
      " client's data outright)."
    )


def default_delta(population: int) -> float:
  """N^-1.1, below 1/N as a meaningful delta must be (McMahan et al. 2018 use it)."""
  return population**-1.1


def calibrate(
  target_epsilon: float,
  rounds: int,
  *,
  clients_per_round: int,
  population: int,
  sampling: str,
  delta: float,
  accountant: str = 'rdp',
  restart_every: int = 0,
  bands: int = 0,
  epoch: int = 0,
) -> float:
  """The smallest noise multiplier (to a relative 1e-6) whose `rounds` rounds spend at
  most `target_epsilon`."""
  check(sampling, accountant, delta, population, restart_every, bands=bands, epoch=epoch)
  if not target_epsilon > 0:
    raise ValueError(f'target_epsilon must be > 0, got {target_epsilon}.')

  @functools.cache
  def spent(log_z: float) -> float:
    return Ledger(
      math.exp(log_z),
      clients_per_round,
      population,
      sampling,
      delta,
      accountant,
      restart_every,
      bands,
      epoch,
    ).epsilon(rounds)

  # PLD's discretization grows without bound as z goes to 0 (38 GiB at z = 1e-3).
  low, high = (0.3 if accountant == 'pld' else 0.05), 1e3
  if spent(math.log(high)) > target_epsilon:
    raise ValueError(
      f'--target_epsilon={target_epsilon} needs a noise multiplier above {high} for'
      f' {rounds} rounds (there epsilon is {spent(math.log(high)):.3g}); set'
      ' --noise_multiplier instead.'
    )
  # PLD's epsilon costs more the smaller z is (at z = 0.3 it took 3.5 s of a 6.4 s
  # calibration to epsilon 2 over 500 rounds, where z = 1.24): its bracket's lower end
  # steps down from `high` by halves, stopping at the first z that spends too much.
  # RDP's costs the same at any z, so its bracket is the whole range.
  upper = high
  while accountant == 'pld' and upper / 2 > low and spent(math.log(upper / 2)) <= target_epsilon:
    upper /= 2
  lower = max(upper / 2, low) if accountant == 'pld' else low
  if spent(math.log(lower)) <= target_epsilon:  # lower is `low`
    raise ValueError(
      f'--target_epsilon={target_epsilon} needs a noise multiplier below {low} for'
      f' {rounds} rounds (there epsilon is {spent(math.log(low)):.3g}); set'
      ' --noise_multiplier instead.'
    )
  # Brent's method (scipy) on log epsilon against log z, nearly a line (epsilon goes as
  # 1/z for large z), not dp_accounting.calibrate_dp_mechanism's bisection: about a third
  # of its 26 epsilons, each 0.3 s with sampling without replacement (the RDP of an order
  # a sum over the order). The root is within `tol` of the crossing; the smallest step
  # up that spends at most the target is returned, as the bisection's upper end was.
  # Epsilon is clamped into floats' range for its log (inf at a tiny z, 0 at a huge one).
  tol = 1e-6
  root = optimize.brentq(
    lambda log_z: math.log(min(max(spent(log_z), 1e-300), 1e300) / target_epsilon),
    math.log(lower),
    math.log(upper),
    xtol=tol,
  )
  step = tol
  while spent(root + step) > target_epsilon:
    step *= 2
  return math.exp(root + step)


_BOUNDED_BY = {'cyclic': 'cyclic participation', 'separated': '--min_separation'}


def _event(ledger: Ledger, rounds: int) -> dp_accounting.DpEvent:
  """The `rounds` rounds of `ledger`'s mechanism as one event."""
  if ledger.bands:
    participations = -(-rounds // ledger.epoch)  # a client's rounds among them, at most
    return dp_accounting.GaussianDpEvent(ledger.noise_multiplier / math.sqrt(participations))
  if ledger.restart_every:
    return _tree_event(ledger, rounds)
  return dp_accounting.SelfComposedDpEvent(_round_event(ledger), rounds)


def _round_event(ledger: Ledger) -> dp_accounting.DpEvent:
  gaussian = dp_accounting.GaussianDpEvent(ledger.noise_multiplier)
  if ledger.sampling == 'poisson':
    q = min(1.0, ledger.clients_per_round / ledger.population)
    return dp_accounting.PoissonSampledDpEvent(q, gaussian)
  return dp_accounting.SampledWithoutReplacementDpEvent(
    ledger.population, ledger.clients_per_round, gaussian
  )


def _tree_event(ledger: Ledger, rounds: int) -> dp_accounting.DpEvent:
  """`rounds` rounds of trees of `ledger.restart_every` rounds: the full trees, then the
  last one's rounds so far."""
  k, z = ledger.restart_every, ledger.noise_multiplier
  trees, rest = divmod(rounds, k)
  events = [
    dp_accounting.SelfComposedDpEvent(dp_accounting.SingleEpochTreeAggregationDpEvent(z, k), trees)
  ]
  if rest:
    events.append(dp_accounting.SingleEpochTreeAggregationDpEvent(z, rest))
  return dp_accounting.ComposedDpEvent(events)


def _fresh(
  sampling: str, accountant: str, correlated: bool = False
) -> dp_accounting.PrivacyAccountant:
  """A fresh accountant; `correlated`: a tree's or BandMF's (noise correlated across
  rounds, a client's update replaced by zeros)."""
  if accountant == 'pld':
    return pld.PLDAccountant()
  if correlated:
    return rdp.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_SPECIAL)
  relation = (
    dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
    if sampling == 'poisson'
    else dp_accounting.NeighboringRelation.REPLACE_ONE
  )
  return rdp.RdpAccountant(neighboring_relation=relation)


class PrivacySpent(callbacks.Callback):
  """Writes `privacy/epsilon` (spent after the round) every `every` rounds, at round 1
  and at the last; ends the run after round `last_round`, the last within the budget,
  when the run asks for more (the state of that round is saved as a finished run's; a
  resumed run past it runs no round)."""

  def __init__(self, ledger: Ledger, last_round: int | None, budget: float | None, every: int = 1):
    self._last, self._budget, self._every = last_round, budget, every
    self._epsilon = ledger.per_round()

  def on_train_begin(self, loop: callbacks.Loop) -> None:
    if self._last is not None and self._last < loop.rounds:
      logging.warning(
        'privacy budget: epsilon %s lasts %d of the %d rounds asked; the run stops after round %d.',
        self._budget,
        self._last,
        loop.rounds,
        self._last,
      )
      loop.rounds = self._last

  def after_round(self, loop: callbacks.Loop, round_num: int, metrics: outputs.Metrics) -> None:
    # Round 1 too: metrics.csv takes its columns from the first round.
    if round_num % self._every == 0 or round_num in (1, loop.rounds):
      metrics['privacy/epsilon'] = self._epsilon(round_num)
