"""The progress line of a run in a log: a compressed run's bytes a round, and a line
between evaluations at least every `callbacks.SAY_EVERY_S` (#76)."""

from tff_comp import experiment, models
from tff_comp.algorithms import fedavg
from tff_comp.ops import aggregators as agg
from tff_comp.ops import communication
from tff_comp.run import callbacks

D = 5


def test_a_compressed_run_shows_its_bytes_on_the_progress_line(capsys, tmp_path):
  model = models.linear_regression((D,))
  plain = fedavg.fedavg(model, client_learning_rate=0.1)
  sparse = fedavg.fedavg(
    model, client_learning_rate=0.1, model_aggregator=agg.Chain((agg.TopK(0.5),), agg.Mean())
  )
  median = fedavg.fedavg(
    model,
    client_learning_rate=0.1,
    client_weighting='uniform',
    model_aggregator=agg.Chain((), agg.Median()),
  )
  assert communication.compressed(sparse)
  assert not communication.compressed(plain) and not communication.compressed(median)
  for compression, shown in (('top_k', True), ('none', False)):
    experiment.train(
      'fedavg',
      'lasso',
      rounds=1,
      compression=compression,
      output_dir=str(tmp_path / compression),
    )
    line = [x for x in capsys.readouterr().err.splitlines() if x.startswith('round 1/1')][0]
    assert ('comm/upload_bytes=' in line) == shown, line


def test_a_log_hears_from_a_run_between_its_evaluations(capsys, tmp_path, monkeypatch):
  """A run evaluating every 5 rounds writes a line at each evaluation, and between them
  once `callbacks.SAY_EVERY_S` passed (here 0: every round)."""

  def lines(name: str) -> list[str]:
    experiment.train('fedavg', 'lasso', rounds=3, eval_period=5, output_dir=str(tmp_path / name))
    return [
      x.split(' (')[0] for x in capsys.readouterr().err.splitlines() if x.startswith('round ')
    ]

  assert lines('quiet') == ['round 3/3']  # the last round's evaluation
  monkeypatch.setattr(callbacks, 'SAY_EVERY_S', 0.0)
  assert lines('chatty') == ['round 1/3', 'round 2/3', 'round 3/3']
