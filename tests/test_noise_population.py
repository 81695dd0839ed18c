"""`--noise_population` P with `--noise_cohort_size` M (pfl-research's population and
noise cohort): the accounting is that of M clients a round out of P, checked against
dp_accounting driven directly, whatever the population the run trains on; the trees and
BandMF take P // M rounds as their cyclic epoch; a population under the run's own is
refused in one line."""

import dp_accounting
from dp_accounting import rdp
import pytest

from tff_comp.config import privacy_settings

P, M, N = 100_000, 1_000, 50  # accounted population and cohort; the run's own population


def _plan(aggregator: str, sampling: str, **options):
  settings = dict(clip_norm=1.0, noise_multiplier=0.8, noise_cohort_size=M, noise_population=P)
  settings.update(options)
  return privacy_settings.PrivacyOptions(**settings).plan(
    aggregator, clients_per_round=4, population=N, rounds=500, sampling=sampling
  )


def test_dp_fedavg_is_accounted_as_m_of_p_by_poisson_sampling():
  ledger = _plan('dp', 'poisson').ledger
  assert 'q = 1000/100000' in ledger.assumption
  assert ledger.delta == pytest.approx(P**-1.1)  # the default delta is P's, not N's
  accountant = rdp.RdpAccountant()
  accountant.compose(
    dp_accounting.PoissonSampledDpEvent(M / P, dp_accounting.GaussianDpEvent(0.8)), 500
  )
  assert ledger.epsilon(500) == pytest.approx(accountant.get_epsilon(P**-1.1), rel=1e-6)
  # Without P, M = 1,000 clients a round cannot be drawn from the run's 50.
  with pytest.raises(ValueError, match='over the population'):
    _plan('dp', 'poisson', noise_population=None)


def test_the_correlated_mechanisms_epoch_is_p_over_m():
  tree = _plan('dp_ftrl_tree', 'cyclic')
  assert tree.ledger.restart_every == tree.ledger.epoch == P // M == 100
  bandmf = _plan('dp_bandmf', 'cyclic', bands=8)
  assert bandmf.ledger.epoch == 100 and bandmf.ledger.bands == 8


def test_a_population_under_the_runs_own_is_refused_in_one_line():
  with pytest.raises(ValueError, match='--noise_population=40 is under the 50 clients') as e:
    _plan('dp', 'poisson', noise_population=40, noise_cohort_size=10)
  assert '\n' not in str(e.value)
