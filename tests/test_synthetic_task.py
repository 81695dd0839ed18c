"""Synthetic(alpha, beta) and its IID control (Li et al., FedProx, MLSys 2020): in the IID
variant one linear model labels every client, so one pooled softmax regression fits
every client; in Synthetic(1, 1) it does not."""

import warnings

import numpy as np
import pytest
from sklearn import linear_model

from tff_comp import experiment
from tff_comp.tasks import synthetic


def _pooled_fit(clients) -> tuple[float, float]:
  """(the pooled accuracy, the worst client's) of one softmax regression on all data."""
  x = np.concatenate([c[0] for c in clients])
  y = np.concatenate([c[1] for c in clients])
  with warnings.catch_warnings():
    warnings.simplefilter('ignore')  # lbfgs' convergence notes
    model = linear_model.LogisticRegression(C=100, max_iter=2000).fit(x, y)
  return model.score(x, y), min(model.score(cx, cy) for cx, cy in clients)


def test_one_model_fits_every_client_of_synthetic_iid_and_not_of_synthetic_1_1():
  iid = synthetic.generate(1.0, 1.0, 30, 0, iid=True)
  pooled, worst = _pooled_fit(iid)
  assert pooled > 0.98 and worst > 0.9, (pooled, worst)
  # Every client's features from one distribution: N(0, Sigma).
  assert max(np.abs(x.mean(0)).max() for x, _ in iid) < 0.5
  pooled, worst = _pooled_fit(synthetic.generate(1.0, 1.0, 30, 0))
  assert worst < 0.75, (pooled, worst)


def test_the_iid_flag_reaches_the_task_and_refuses_alpha_and_beta():
  def config(**options):
    return experiment.ExperimentConfig.of(
      algorithm='fedavg', task='synthetic', clients_per_round=5, task_options=options
    )

  prepared = experiment.prepare(config(iid=True, num_clients=5))
  assert prepared.task.train_data.client_ids == [str(i) for i in range(5)]
  with pytest.raises(experiment.ConfigError, match='drop alpha and beta'):
    experiment.prepare(config(iid=True, alpha=0.5))
