"""Aggregation from the settings (`--aggregator`, `--compression`, `--secure_aggregation`,
`--attack`): the chain they assemble, the bytes a round reports, a resumed run with error
feedback equal to an uninterrupted one, batched trials equal to their separate runs, and
every combination that cannot work (or a setting that would be ignored) refused in one
line before any work."""

import csv
import dataclasses
import json
import math

import numpy as np
import pytest

from tff_comp import experiment, trials
from tff_comp.config import aggregation_settings
from tff_comp.run import outputs, training_loop

BASE = dict(algorithm='fedavg', task='quadratic', rounds=6, eval_period=3, checkpoint_every=2)


def _config(path, **settings):
  return experiment.ExperimentConfig.of(output_dir=str(path), **{**BASE, **settings})


def _rows(path):
  with open(path / 'metrics.csv', newline='') as f:
    return [{k: v for k, v in row.items() if 'seconds' not in k} for row in csv.DictReader(f)]


def test_the_flags_assemble_their_chain_and_the_round_counts_its_bytes(tmp_path):
  prepared = experiment.prepare(
    _config(
      tmp_path,
      aggregator='trimmed_mean',
      trim_fraction=0.2,
      compression='top_k',
      sparsity_fraction=0.5,
      attack='sign_flip',
      attack_fraction=0.3,
    )
  )
  chain = prepared.builder_args['model_aggregator']
  assert chain.name == 'attack+top_k+trimmed_mean'
  assert prepared.settings.client_weighting == 'uniform'  # robust: every client alike
  experiment.run_experiment(prepared, show_progress=False)
  recorded = json.loads((tmp_path / 'config.json').read_text())['aggregation']
  assert recorded['compression'] == 'top_k' and recorded['attack'] == 'sign_flip'
  d = sum(np.size(w) for w in prepared.task.model.initial_weights[0])
  k = round(0.5 * d)
  per_client = k * (32 + max(1, math.ceil(math.log2(d)))) / 8
  rows = _rows(tmp_path)[1:]
  for row in rows:
    assert float(row['comm/upload_bytes']) == pytest.approx(
      float(row['participation/reporting']) * per_client
    )
    assert float(row['comm/download_bytes']) == float(row['participation/sampled']) * 4 * d
  assert any(float(row['train/aggregator/byzantine_clients']) > 0 for row in rows)


def test_bulyan_from_the_flags(tmp_path):
  """--aggregator=bulyan --byzantine_clients=1: the block (tests/test_bulyan.py checks its
  math) with that f, every client alike, the rows chosen (m - 2f) reported."""
  from tff_comp.ops import aggregators

  prepared = experiment.prepare(
    _config(
      tmp_path, task='synthetic', aggregator='bulyan', byzantine_clients=1, clients_per_round=7
    )
  )
  chain = prepared.builder_args['model_aggregator']
  assert isinstance(chain.combiner, aggregators.Bulyan) and chain.combiner.byzantine == 1
  assert prepared.settings.client_weighting == 'uniform'
  experiment.run_experiment(prepared, show_progress=False)
  rows = _rows(tmp_path)
  assert all(float(r['train/aggregator/bulyan_selected']) == 5 for r in rows[1:])
  assert float(rows[-1]['eval/test_loss']) < float(rows[0]['eval/test_loss'])


def test_a_resumed_run_with_error_feedback_ends_as_an_uninterrupted_one(tmp_path):
  """The clients' residuals are in the checkpoint: a run interrupted and resumed ends
  with the uninterrupted run's rows and model, to the bit."""
  settings = dict(compression='top_k', sparsity_fraction=0.3, error_feedback='ef', seed=2)
  experiment.run_experiment(
    experiment.prepare(_config(tmp_path / 'whole', **settings)), show_progress=False
  )
  prepared = experiment.prepare(_config(tmp_path / 'cut', **settings))
  runner = experiment.build_runner(prepared)
  runtime, calls = runner.runtime, []

  class Cut:  # Ctrl-C in round 4
    def __getattr__(self, name):
      return getattr(runtime, name)

    def next(self, state, ids, work=None):
      calls.append(1)
      if len(calls) == 4:
        raise KeyboardInterrupt
      return runtime.next(state, ids, work)

  runner.runtime = Cut()
  with pytest.raises(training_loop.Interrupted):
    experiment.train_runner(prepared, runner, show_progress=False)
  experiment.run_experiment(
    experiment.prepare(_config(tmp_path / 'cut', resume=True, **settings)), show_progress=False
  )
  assert _rows(tmp_path / 'cut') == _rows(tmp_path / 'whole')
  for a, b in zip(
    outputs.load_model(tmp_path / 'cut' / 'final_model.npz').trainable,
    outputs.load_model(tmp_path / 'whole' / 'final_model.npz').trainable,
    strict=True,
  ):
    np.testing.assert_array_equal(a, b)


def test_batched_trials_with_a_robust_chain_equal_their_separate_runs(tmp_path):
  settings = dict(aggregator='median', compression='quantize', quantize_bits=6, engine='mapped')
  configs = [_config(tmp_path / f'grid{s}', seed=s, **settings) for s in (1, 2)]
  said = []
  results = trials.run_trials([trials.Trial(c) for c in configs], say=said.append)
  assert any('batched into one program' in line for line in said), said
  for config, result in zip(configs, results, strict=True):
    alone = experiment.run_experiment(
      experiment.prepare(_config(tmp_path / f'alone{config.seed}', seed=config.seed, **settings)),
      show_progress=False,
    )
    assert result == alone


@pytest.mark.parametrize(
  'settings, says',
  [
    (dict(quantize_bits=4), '--quantize_bits applies with --compression=quantize'),
    (dict(trim_fraction=0.3), '--trim_fraction applies with --aggregator=trimmed_mean'),
    (dict(secure_bits=8), '--secure_bits applies with --secure_aggregation=true'),
    (dict(attack_fraction=0.3), '--attack_fraction applies with --attack='),
    (dict(error_feedback='ef'), '--error_feedback applies with --compression='),
    (
      dict(compression='qsgd', error_feedback='ef21'),
      '--error_feedback=ef21 needs a contractive compressor, and --compression=qsgd is not',
    ),
    (
      dict(aggregator='krum', secure_aggregation=True),
      "needs each client's update, while --secure_aggregation reveals only their total",
    ),
    (
      dict(compression='top_k', error_feedback='ef', sampling='with_replacement'),
      'a client drawn twice a round would overwrite',
    ),
    (
      dict(aggregator='median', client_weighting='examples'),
      'weighs every client alike (a robust combiner)',
    ),
    (
      dict(compression='sign', client_weighting='examples'),
      '--compression=sign (a majority vote) weighs every client alike',
    ),
    (dict(aggregator='median', clip_norm=1.0), '--clip_norm sets a clipping or DP aggregator'),
    (
      dict(aggregator='krum', byzantine_clients=2, clients_per_round=5),
      '--aggregator=krum needs at least 7 rows a round (2 f + 3 with f = 2):'
      ' --clients_per_round=5.',
    ),
    (
      dict(aggregator='multi_krum', multi_krum_select=6, clients_per_round=5),
      '--aggregator=multi_krum needs at least 6 rows a round (it averages the 6 rows',
    ),
    (
      dict(aggregator='bulyan', byzantine_clients=1, clients_per_round=5),
      '--aggregator=bulyan needs at least 7 rows a round (4 f + 3 with f = 1)',
    ),
    (
      dict(aggregator='median', clients_per_round=2),
      '--aggregator=median needs at least 3 rows a round (the median of two rows is their'
      ' mean): --clients_per_round=2.',
    ),
    (
      dict(aggregator='geometric_median', clients_per_round=2),
      '--aggregator=geometric_median needs at least 3 rows a round',
    ),
    (
      dict(aggregator='trimmed_mean', clients_per_round=5),
      '--aggregator=trimmed_mean needs at least 10 rows a round (it drops floor(0.1 m)',
    ),
    (
      dict(aggregator='median', pre_aggregation='nnm', byzantine_clients=2, clients_per_round=4),
      '--pre_aggregation=nnm needs at least 5 clients a round (2 f + 1 with f = 2):'
      ' --clients_per_round=4.',
    ),
    (  # Krum reads the buckets: 3 of them
      dict(aggregator='krum', pre_aggregation='bucketing', bucket_size=2, clients_per_round=6),
      '--aggregator=krum needs at least 5 rows a round (2 f + 3 with f = 1):'
      ' --clients_per_round=6 gives 3 after --pre_aggregation=bucketing.',
    ),
    (
      dict(aggregator='centered_clip', centered_clip_tau=1e-300),
      '--centered_clip_tau must be >= 1e-30, got 1e-300',
    ),
    (dict(secure_aggregation=True, secure_bound=1e300), '--secure_bound must be <= 1e+30'),
    (dict(attack='scaled', attack_scale=1e300), '--attack_scale must be <= 1e+30'),
    (
      dict(sampling='uniform', min_separation=2, clients_per_round=5),
      '--min_separation=2 with 5 clients a round needs at least 10 clients',
    ),
  ],
)
def test_what_cannot_work_is_one_line_before_any_work(tmp_path, settings, says):
  with pytest.raises(experiment.ConfigError) as error:
    experiment.prepare(_config(tmp_path, **settings))
  assert says in str(error.value) and '\n' not in str(error.value)
  assert not tmp_path.exists() or not any(tmp_path.iterdir())


def test_a_trimmed_mean_asked_to_trim_nothing_runs():
  options = aggregation_settings.AggregationOptions(aggregator='trimmed_mean', trim_fraction=0.0)
  assert options.chain(None, clients_per_round=2).combiner.beta == 0.0
  kept = dataclasses.replace(options, trim_fraction=0.2)  # floor(0.2 x 5) = 1 at each end
  assert kept.chain(None, clients_per_round=5).combiner.beta == 0.2


def test_multi_krum_averages_m_minus_f_of_the_rows_it_reads():
  """After bucketing, the m of Multi-Krum's m - f is the buckets' count."""
  options = aggregation_settings.AggregationOptions(
    aggregator='multi_krum', byzantine_clients=1, pre_aggregation='bucketing', bucket_size=2
  )
  assert options.chain(None, clients_per_round=11).combiner.select == 5  # 6 buckets


def test_multi_krum_averages_m_minus_f_rows_by_default():
  """Blanchard et al.'s Multi-Krum keeps m - f rows, with m the cohort (#75: a run with
  m - f - 2 went unnoticed)."""
  options = aggregation_settings.AggregationOptions(aggregator='multi_krum', byzantine_clients=2)
  combiner = options.chain(None, clients_per_round=10).combiner
  assert (combiner.byzantine, combiner.select) == (2, 8)
