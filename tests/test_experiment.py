"""Every registered algorithm end to end through run.py's path (experiment.prepare and
run_experiment), on its home task with that pair's defaults; seeds; divergence hints."""

import configparser
import csv
import fnmatch
import json
import math
import pathlib
import re
import shlex
import sys

import numpy as np
import pytest
import tensorflow as tf

from tests import algorithm_cases
from tff_comp import experiment, registry
from tff_comp.run import callbacks, outputs


def _config(tmp_path, algorithm='fedavg', **kwargs):
  return experiment.ExperimentConfig.of(algorithm=algorithm, output_dir=str(tmp_path), **kwargs)


def _documented_metrics() -> list[str]:
  """The column names (fnmatch patterns) of docs/metrics.md's table."""
  section = (pathlib.Path(experiment.__file__).parent.parent / 'docs' / 'metrics.md').read_text()
  names = [
    name
    for line in section.splitlines()
    if line.startswith('| `')
    for name in re.findall(r'`([^`]+)`', line.split(' | ')[0])
  ]
  assert len(names) > 30, names
  return names


# Ditto's and Local-MOML's home tasks run end to end under make test-slow.
_END_TO_END = ('fedavg', 'scaffold', 'fednova', 'feddualavg')


@pytest.mark.parametrize('name', algorithm_cases.each_algorithm(keep=_END_TO_END))
def test_every_algorithm_runs_end_to_end_on_its_home_task(tmp_path, name):
  prepared = experiment.prepare(_config(tmp_path, name, rounds=2, eval_period=1))
  assert prepared.config.task == registry.get_algorithm(name).home_task
  final = experiment.run_experiment(prepared, show_progress=False)
  assert final and all(math.isfinite(v) for v in final.values())
  rows = (tmp_path / 'metrics.csv').read_text().splitlines()
  assert len(rows) == 4  # header, rounds 0 to 2
  documented = _documented_metrics()
  undocumented = [
    c for c in rows[0].split(',') if not any(fnmatch.fnmatchcase(c, p) for p in documented)
  ]
  assert not undocumented, f"columns missing from docs/metrics.md's table: {undocumented}"
  logged = {
    'feddualavg': 'server/elapsed',
    'afl': 'server/client_weights/9',
    'tr_maml': 'server/lambda_learning_rate',
    'fedavg': 'hparams/client_work/momentum',
    'local_moml': 'server/seen',
  }
  if name in logged:  # what defines the method is logged every round
    column = rows[0].split(',').index(logged[name])
    assert all(r.split(',')[column] for r in rows[2:]), rows
  assert not [c for c in rows[0].split(',') if c.startswith('server/seen/')]  # one count
  if prepared.task.evaluate_clients is not None:  # one per-client CSV per evaluation
    files = sorted((tmp_path / 'clients').glob('eval_round_*.csv'))
    assert [f.name for f in files] == [f'eval_round_0000{r}.csv' for r in range(3)]
    with open(files[-1]) as f:
      per_client = list(csv.DictReader(f))
    with open(tmp_path / 'metrics.csv') as f:
      last = list(csv.DictReader(f))[-1]
    # The per-client rows are what the round's summary metrics summarize.
    worst = {
      'imbalanced_digits': ('accuracy', min, 'eval/worst_accuracy'),
      'synthetic': ('test_accuracy', None, None),
      'sinewave': ('loss_after', max, 'eval/worst_loss_after'),
      'dominant_class': ('accuracy_after', min, 'eval/worst_accuracy_after'),
    }
    column, pick, summary = worst[prepared.config.task]
    if name == 'ditto':  # each client's own model beside the global model's scores
      own = [float(row['personal_accuracy']) for row in per_client]
      assert min(own) == pytest.approx(float(last['eval/personal_worst_accuracy']))
    values = [float(row[column]) for row in per_client]
    assert len(values) >= 10 and all(math.isfinite(v) for v in values)
    if pick is not None:
      assert pick(values) == pytest.approx(float(last[summary]), rel=1e-6)


def test_home_settings_apply_on_the_home_task_only(tmp_path):
  home = experiment.prepare(_config(tmp_path, 'tr_maml'))
  assert home.config.task == 'dominant_class'
  assert home.builder_args['alpha'] == 0.05 and home.builder_args['local_steps'] == 5
  given = experiment.prepare(_config(tmp_path, 'tr_maml', algorithm_options=dict(alpha=0.2)))
  assert given.builder_args['alpha'] == 0.2
  elsewhere = experiment.prepare(_config(tmp_path, 'tr_maml', task='sinewave'))
  assert 'alpha' not in elsewhere.builder_args
  nova = experiment.prepare(_config(tmp_path, 'fednova'))
  assert nova.settings.local_epochs == 2 and nova.builder_args['local_epochs_max'] == 5


def test_data_seed_and_run_seed_are_separate(tmp_path):
  def data(**seeds):
    task = experiment.prepare(_config(tmp_path, 'fedavg', **seeds)).task
    return np.asarray(task.client_arrays().examples[0])

  np.testing.assert_array_equal(data(seed=0, data_seed=0), data(seed=7, data_seed=0))
  assert not np.array_equal(data(seed=0, data_seed=0), data(seed=0, data_seed=1))
  assert (
    experiment.prepare(_config(tmp_path, 'fedavg', seed=3, data_seed=None)).config.task_seed == 3
  )


def test_divergence_names_the_algorithms_likely_cause(tmp_path):
  """ComFedL's DRFL step carries exp(loss / gamma): on sinewave, gamma 0.2 overflows."""
  prepared = experiment.prepare(_config(tmp_path, 'comfedl', task='sinewave', rounds=3))
  with pytest.raises(callbacks.DivergenceError, match='try a larger --gamma'):
    experiment.run_experiment(prepared, show_progress=False)
  prepared = experiment.prepare(
    _config(
      tmp_path,
      'comfedl',
      task='sinewave',
      rounds=3,
      overwrite=True,
      algorithm_options=dict(gamma=2.0),
    )
  )
  assert all(
    math.isfinite(v) for v in experiment.run_experiment(prepared, show_progress=False).values()
  )


def test_l1_ball_of_radius_zero_runs_from_the_command_line_path(tmp_path):
  """The ball of radius 0 holds only 0: the constrained weights end at 0 exactly."""
  prepared = experiment.prepare(
    _config(
      tmp_path,
      'fedmid',
      task='constrained_digits',
      regularizer='l1_ball',
      regularizer_strength=0.0,
      rounds=1,
    )
  )
  final = experiment.run_experiment(prepared, show_progress=False)
  assert all(math.isfinite(v) for v in final.values())
  weights = outputs.load_model(tmp_path / 'final_model.npz').trainable
  constrained = [weights[i] for i in prepared.task.regularizer_targets]
  assert constrained and all(np.all(w == 0) for w in constrained)


@pytest.mark.slow
@pytest.mark.parametrize('name', registry.ALGORITHMS.names())
def test_every_algorithm_runs_its_whole_default_run_without_diverging(tmp_path, name):
  prepared = experiment.prepare(_config(tmp_path, name))
  final = experiment.run_experiment(prepared, show_progress=False)
  assert all(math.isfinite(v) for v in final.values())


@pytest.mark.parametrize(
  'change,says',
  [
    (
      dict(algorithm='fednova', algorithm_options=dict(local_epochs_max=10**11)),
      'local_epochs_max must be <= 10000',
    ),
    (
      dict(algorithm='fedmid', task='sparse_logreg', task_options=dict(dim=10**9)),
      'would take 4626.8 GiB',
    ),
    (dict(algorithm='fedavg', seed=-1), '--seed must be >= 0'),
  ],
)
def test_absurd_sizes_are_one_line_errors_before_any_work(tmp_path, change, says):
  with pytest.raises(experiment.ConfigError, match=says):
    experiment.build_runner(experiment.prepare(_config(tmp_path, **change)))


@pytest.mark.parametrize(
  'options, says',
  [
    (dict(algorithm_options=dict(mu='0.1')), "--mu takes a number, got '0.1'"),
    (dict(algorithm_options=dict(mu=[0.1])), '--mu takes a number, got [0.1]'),
    (dict(algorithm_options=dict(mu=True)), '--mu takes a number, got True'),
    (dict(algorithm_options=dict(mu=float('nan'))), '--mu must be a finite number'),
    (dict(task_options=dict(dim=2.5)), '--quadratic_dim takes an integer, got 2.5'),
  ],
)
def test_options_of_another_type_are_one_line_errors(tmp_path, options, says):
  """The Python API's options are typed as the builder's signature declares them when
  the config is made (the flags are typed by absl)."""
  with pytest.raises(experiment.ConfigError, match=re.escape(says)):
    experiment.prepare(_config(tmp_path, 'fedprox', task='quadratic', **options))


def test_options_are_recorded_as_the_builder_takes_them(tmp_path):
  """An integer for a float, NumPy scalars: Python's float and int (config.json's JSON)."""
  prepared = experiment.prepare(
    _config(
      tmp_path,
      'fedprox',
      task='quadratic',
      algorithm_options=dict(mu=1),
      task_options=dict(dim=np.int64(3)),
    )
  )
  assert type(prepared.config.algorithm_options['mu']) is float
  assert type(prepared.config.task_options['dim']) is int
  assert prepared.task.weight_shapes == [(3,)]


def test_a_task_too_large_for_memory_is_a_one_line_error(tmp_path):
  """Beyond the tasks' own size checks: an allocation NumPy refuses."""
  with pytest.raises(experiment.ConfigError, match="task 'quadratic': its data do not fit"):
    experiment.prepare(_config(tmp_path, 'fedavg', task='quadratic', task_options=dict(dim=2**40)))


@pytest.mark.parametrize('under', [False, True])
def test_a_data_directory_that_is_a_file_is_a_one_line_error(tmp_path, monkeypatch, under):
  (tmp_path / 'file').write_text('')
  monkeypatch.setenv(
    'TFF_COMP_DATA_DIR', str(tmp_path / 'file' / 'sub' if under else tmp_path / 'file')
  )
  with pytest.raises(experiment.ConfigError, match='is a file, not a directory'):
    experiment.prepare(_config(tmp_path / 'out', 'fedavg'))


def test_config_json_records_every_option_in_force_and_the_environment(tmp_path):
  """Defaults included (Ditto's `lam`, the task's options), versions and the commit."""
  prepared = experiment.prepare(_config(tmp_path, 'ditto', rounds=1))
  experiment.run_experiment(prepared, show_progress=False)
  recorded = json.loads((tmp_path / 'config.json').read_text())
  lam = next(h.default for h in registry.get_algorithm('ditto').hparams if h.name == 'lam')
  assert recorded['resolved']['algorithm_options']['lam'] == lam
  assert recorded['algorithm_options'] == {}  # what was given stays apart
  task = registry.get_task(recorded['task'])
  assert set(recorded['resolved']['task_options']) == {
    h.name for h in task.hparams if h.name != 'seed'
  }
  env = recorded['environment']
  assert env['tensorflow'] == tf.__version__ and env['tensorflow_federated'] == '0.87.0'
  assert env['tff_comp'] and env['python']
  # The process's command line, and the packages registering plugins (none installed).
  assert shlex.split(env['command'])[1:] == sys.argv and env['plugins'] == {}
  # The version recorded is the one being built (it said 0.2.0 with 0.3.0's features in).
  setup = configparser.ConfigParser()
  setup.read(pathlib.Path(experiment.__file__).parent.parent / 'setup.cfg')
  if setup.has_option('metadata', 'version'):  # a checkout, not an installed wheel
    assert env['tff_comp'] == setup['metadata']['version']
  if (pathlib.Path(experiment.__file__).parent.parent / '.git').exists():
    assert len(env['git_commit']) == 40 and isinstance(env['git_dirty'], bool)


def test_the_readme_python_example_trains(tmp_path, monkeypatch):
  """README.md's Python example runs as written (writing under tmp_path) and trains."""
  readme = (pathlib.Path(experiment.__file__).parent.parent / 'README.md').read_text()
  code = readme.split('## In Python', 1)[1].split('```python\n', 1)[1].split('```', 1)[0]
  assert len(code.splitlines()) <= 15, code
  monkeypatch.chdir(tmp_path)
  namespace = {}
  exec(code, namespace)
  final = namespace['final']
  assert final['eval/f1'] > 0.9, final
  recorded = json.loads((tmp_path / 'runs' / 'feddualavg-example' / 'config.json').read_text())
  assert recorded['task_options'] == {'dataset': 'II'}
  assert recorded['participation']['sampling'] == 'poisson'


def test_an_unknown_setting_is_refused_naming_the_nearest_known_one():
  """A misspelt setting names the setting meant, whichever owns it (a record's, the
  algorithm's, the task's, a runtime's), as absl does for a misspelt flag; refused
  before anything is built."""
  for given, says in (
    (dict(byzantine=4), 'byzantine (did you mean byzantine_clients?)'),
    (dict(lasso_datset='II'), 'lasso_datset (did you mean lasso_dataset?)'),
    (dict(server_momentun=0.9), 'server_momentun (did you mean server_momentum?)'),
    (dict(engin='lanes'), 'engin (did you mean engine?)'),
    (dict(round=3, clip=1.0), 'clip (did you mean clip_norm?), round (did you mean rounds?)'),
  ):
    with pytest.raises(experiment.ConfigError) as refused:
      experiment.train('fedavg', 'lasso', output_dir='unused', **given)
    assert str(refused.value) == f'unknown settings: {says}.'
  with pytest.raises(experiment.ConfigError, match=r'^unknown settings: samples \(did you'):
    experiment.ExperimentConfig.of(algorithm='fedavg', samples=2)


def test_train_takes_options_by_their_flag_names_and_refuses_unknown_ones(tmp_path):
  final = experiment.train(
    'fedavg', task='quadratic', rounds=2, output_dir=str(tmp_path), show_progress=False
  )
  assert final
  with pytest.raises(experiment.ConfigError, match='unknown settings: mu'):
    experiment.train('fedavg', task='quadratic', mu=0.1, output_dir=str(tmp_path / 'b'))


def test_of_keeps_a_record_given_whole_and_refuses_it_beside_its_flat_settings():
  from tff_comp.run import sampling

  whole = sampling.Participation(sampling='poisson', dropout_rate=0.2)
  config = experiment.ExperimentConfig.of(algorithm='fedavg', participation=whole)
  assert config.participation == whole
  with pytest.raises(experiment.ConfigError, match='both set participation'):
    experiment.ExperimentConfig.of(algorithm='fedavg', participation=whole, sampling='uniform')


def test_config_json_records_the_client_hyperparameters_in_force(tmp_path):
  """A grid sets a client hyperparameter by the rule's name (FedProx's option `mu` is
  its rule's `proximal_strength`): config.json records the value in force, not only
  the option's default."""
  prepared = experiment.prepare(
    experiment.ExperimentConfig.of(
      algorithm='fedprox', task='quadratic', rounds=1, output_dir=str(tmp_path)
    )
  )
  runner = experiment.build_runner(prepared)
  experiment.train_runner(
    prepared,
    runner,
    show_progress=False,
    learning_rates=(0.05, 1.0),
    client_hparams={'proximal_strength': 0.3},
  )
  resolved = json.loads((tmp_path / 'config.json').read_text())['resolved']
  assert resolved['client_hparams']['proximal_strength'] == pytest.approx(0.3)
  assert resolved['client_hparams']['learning_rate'] == pytest.approx(0.05)
  # Resuming compares what the values came from, not the values resolved at training.
  resumed = experiment.prepare(
    experiment.ExperimentConfig.of(
      algorithm='fedprox', task='quadratic', rounds=2, output_dir=str(tmp_path), resume=True
    )
  )
  assert resumed.config.resume


def test_train_takes_a_whole_config_and_refuses_settings_beside_it():
  config = experiment.ExperimentConfig.of(algorithm='fedavg', task='lasso')
  with pytest.raises(experiment.ConfigError, match=r'set task, rounds in it'):
    experiment.train(config, 'lasso', rounds=3)
  with pytest.raises(experiment.ConfigError, match='a registered name or an ExperimentConfig'):
    experiment.train(42)


def test_train_joins_options_by_name_and_given_whole(monkeypatch):
  """`algorithm_options=` and `task_options=` (the config's fields) join the options
  given by name; a name in both is refused."""
  configs = []
  monkeypatch.setattr(experiment, 'run_experiment', lambda prepared, **_: configs.append(prepared))
  experiment.train(
    'fedprox', 'lasso', mu=0.1, task_options={'dataset': 'II'}, algorithm_options={}, rounds=1
  )
  experiment.train('fedprox', 'lasso', algorithm_options={'mu': 0.1}, lasso_dataset='II', rounds=1)
  by_name, whole = (prepared.config for prepared in configs)
  assert by_name == whole
  assert by_name.algorithm_options == {'mu': 0.1} and by_name.task_options == {'dataset': 'II'}
  with pytest.raises(experiment.ConfigError, match=r'^mu given both by name and in algorithm_opt'):
    experiment.train('fedprox', 'lasso', mu=0.1, algorithm_options={'mu': 0.2})
