"""Tasks for personalization: dominant_class (bundled digits, CIFAR-10 from a fixture)
and sinewave."""

import numpy as np
import pytest

from tff_comp.tasks import dominant_class, sinewave


def test_dominant_partition_proportions():
  labels = np.repeat(np.arange(10), 100)  # each class serves 28 + 9 x 8 = 100
  parts = dominant_class.dominant_partition(labels, 0.28, 100, np.random.default_rng(0))
  for i, p in enumerate(parts):
    counts = np.bincount(labels[p], minlength=10)
    assert counts[i] == 28 and all(counts[c] == 8 for c in range(10) if c != i)
  assert len(np.unique(np.concatenate(parts))) == sum(len(p) for p in parts)
  with pytest.raises(ValueError, match='too few'):
    dominant_class.dominant_partition(labels, 0.9, 200, np.random.default_rng(0))


def test_dominant_class_task_with_personalized_metrics():
  task = dominant_class.build_dominant_class_task()
  assert task.num_clients == 10
  metrics = task.evaluate(tuple(w for w in task.model.initial_weights[0]))
  assert metrics['accuracy_before'] == pytest.approx(0.1, abs=0.1)
  assert {'worst_accuracy_after', 'loss_after', 'worst_loss_after'} <= set(metrics)


def test_cifar10_variant_offline(tmp_path):
  rng = np.random.default_rng(0)
  fixture = tmp_path / 'cifar10.npz'
  np.savez(
    fixture,
    x_train=rng.integers(0, 256, (400, 32, 32, 3), dtype=np.uint8),
    y_train=np.repeat(np.arange(10), 40).reshape(-1, 1).astype(np.uint8),
  )
  task = dominant_class.build_dominant_class_task(
    source='cifar10', cifar10_path=str(fixture), examples=30
  )
  x, _ = next(iter(task.train_data.create_tf_dataset_for_client('3').batch(100)))
  assert x.shape == (24, 3072) and float(np.max(x)) <= 1.0


def test_sinewave_tasks_are_sines():
  clients = sinewave.generate(20, 5, np.random.default_rng(1))
  for x_train, y_train, x_test, y_test in clients:
    x = np.concatenate([x_train, x_test])[:, 0]
    y = np.concatenate([y_train, y_test])
    assert x.min() >= -5 and x.max() <= 5 and np.abs(y).max() <= 5
    # y = A sin(x - phi) = a sin x + b cos x: an exact least-squares fit.
    design = np.stack([np.sin(x), np.cos(x)], 1)
    coef, residual, *_ = np.linalg.lstsq(design, y, rcond=None)
    assert 0.1 - 1e-4 <= np.hypot(*coef) <= 5 + 1e-4
    assert residual.size == 0 or residual[0] < 1e-6
