"""The nuclear-norm task: ground truth, centralized reference, FedDualAvg recovers the rank."""

import numpy as np
import pytest

from tff_comp import experiment
from tff_comp.tasks import nuclear


@pytest.mark.parametrize('dataset,rank', [('I', 16), ('II', 4), ('III', 1)])
def test_ground_truth_rank_and_data(dataset, rank):
  w_star, clients, validation = nuclear._generate(dataset, 0, 1.0, 1.0)
  assert nuclear.rank_of(w_star) == rank
  assert len(clients) == 64 and clients[0][0].shape == (128, 32, 32)
  assert len(validation) == nuclear.VALIDATION_CLIENTS


def test_centralized_reference_has_the_true_rank():
  task = nuclear.build_nuclear_task(dataset='II')
  ref = task.reference()
  assert ref['rank'] == 4
  assert ref['frobenius_error'] < 1.0  # the optimum is near W* (norm 2)


def test_models_scored_together_equal_each_scored_alone():
  """`evaluate_many` (a grid's trials) gives each model what `evaluate` and the losses
  on the whole pooled data give it, to the bit."""
  task = nuclear.build_nuclear_task(dataset='II')
  _, clients, validation = nuclear._generate('II', 0, 1.0, 1.0)
  rng = np.random.default_rng(0)
  models = [
    ((rng.standard_normal((32, 32)).astype(np.float32), np.float32(b)), task.regularizer)
    for b in (0.5, -1.0)
  ]
  together = task.evaluate_many(models)
  assert together == [task.evaluate(*model) for model in models]
  for ((kernel, b), _), metrics in zip(models, together):
    x, y = (np.concatenate(part) for part in zip(*clients))
    assert metrics['train_loss'] == 0.5 * float(
      np.mean((x.reshape(len(x), -1) @ kernel.ravel() + b - y) ** 2)
    )
    x, y = (np.concatenate(part) for part in zip(*validation))
    assert metrics['validation_mse'] == float(
      np.mean((x.reshape(len(x), -1) @ kernel.ravel() + b - y) ** 2)
    )


@pytest.mark.slow  # a reproduction (200 rounds)
def test_feddualavg_recovers_the_rank_within_200_rounds(tmp_path):
  prepared = experiment.prepare(
    experiment.ExperimentConfig.of(
      algorithm='feddualavg', task='nuclear', rounds=200, eval_period=50, output_dir=str(tmp_path)
    )
  )
  final = experiment.run_experiment(prepared, show_progress=False)
  assert final['eval/rank'] == 16
  assert final['eval/frobenius_error'] < 2.0
