"""Plugins installed through entry points: future annotations, clashes, duplicates, and
docs/plugins.md's complete plugin example."""

import csv
import os
import re
import subprocess
import sys
import textwrap

import pytest

from tff_comp import registry

PLUGIN = '''
from __future__ import annotations

from tff_comp.algorithms import fedavg


def build_myplug(model, *, client_learning_rate: float, zeta: float = 0.5, {extra}):
  """My algorithm: FedAvg with an option zeta.

  Args:
    zeta: how much zeta there is,
      in the plugin's own words.
  """
  return fedavg.build_fedavg(model, client_learning_rate=client_learning_rate)


def build_other(model, *, client_learning_rate: float):
  """Another algorithm, registered under a taken name."""
  return fedavg.build_fedavg(model, client_learning_rate=client_learning_rate)
'''


def _install(root, name, extra, entry_points, source=PLUGIN):
  """A package `name` (`source` with `extra` filled in) and its dist-info on `root`, as
  pip would install them."""
  (root / name).mkdir()
  (root / name / '__init__.py').write_text(source.format(extra=extra))
  info = root / f'{name}-0.1.dist-info'
  info.mkdir()
  (info / 'METADATA').write_text(f'Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n')
  (info / 'entry_points.txt').write_text(textwrap.dedent(entry_points))


def _help(repo_root, root):
  return subprocess.run(
    [sys.executable, str(repo_root / 'binaries' / 'run.py'), '--helpfull'],
    capture_output=True,
    text=True,
    timeout=300,
    cwd=repo_root,
    stdin=subprocess.DEVNULL,
    env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3', PYTHONPATH=str(root)),
  )


def test_future_annotations_give_flags_and_a_duplicate_name_warns(repo_root, tmp_path):
  _install(
    tmp_path,
    'myplug',
    'eta_z: int = 2',
    """
      [tff_comp.algorithms]
      myplug = myplug:build_myplug
      fedavg = myplug:build_other
      """,
  )
  out = _help(repo_root, tmp_path)
  assert out.returncode == 0 and '--zeta' in out.stdout and '--eta_z' in out.stdout, out.stderr
  # tff_comp's flags only, not those of every library imported (absl.testing's
  # --test_random_seed, TensorFlow's TPU flags).
  assert 'test_random_seed' not in out.stdout and '--tpu' not in out.stdout.lower()
  # Help lists every algorithm and task with a line each, and the choices of options.
  assert 'myplug: My algorithm: FedAvg with an option zeta.' in out.stdout
  assert 'lasso: Federated LASSO (Yuan, Zaheer, Reddi, ICML 2021, section 6).' in out.stdout
  assert '--variant: <exact|fo|hf>' in out.stdout
  # Each option says what it does, from its builder's docstring (`Args:`).
  assert "--zeta: how much zeta there is, in the plugin's own words. Option of myplug" in (
    ' '.join(out.stdout.split())
  )
  assert '--q: fairness parameter of q-FFL' in out.stdout
  assert '--lasso_l1: Task lasso (default 0.3): L1 strength lam' in out.stdout
  assert '--lasso_dataset: <I|II|III|IV>' in out.stdout
  assert (
    "plugin myplug:build_other registers algorithm 'fedavg', already registered by"
    ' tff_comp.algorithms.fedavg.fedavg'
  ) in out.stderr


def test_a_clashing_option_is_one_line_naming_the_plugin(repo_root, tmp_path):
  _install(
    tmp_path,
    'clashplug',
    'mu: str = "x"',
    """
      [tff_comp.algorithms]
      clashplug = clashplug:build_myplug
      """,
  )
  out = _help(repo_root, tmp_path)
  assert out.returncode == 2
  lines = out.stderr.strip().splitlines()
  assert len(lines) == 1 and 'Traceback' not in out.stderr
  assert "--mu: algorithm 'clashplug' (clashplug) takes it as str" in lines[0], lines


def _readme_blocks(repo_root, language: str) -> list[str]:
  """The ```language blocks of docs/plugins.md's complete plugin example."""
  text = (repo_root / 'docs' / 'plugins.md').read_text()
  return re.findall(rf'```{language}\n(.*?)```', text[text.index('A complete plugin') :], re.S)


def test_the_readme_plugin_example_installs_and_runs(repo_root, tmp_path):
  """docs/plugins.md's plugin, installed as pip would (package and dist-info with the
  entry points of its pyproject.toml), trains from run.py and explains its options."""
  (tmp_path / 'my_fl_plugin').mkdir()
  (tmp_path / 'my_fl_plugin' / '__init__.py').write_text(_readme_blocks(repo_root, 'python')[0])
  toml = _readme_blocks(repo_root, 'toml')[0]
  entry_points = re.sub(r'\[project\.entry-points\."([^"]+)"\]', r'[\1]', toml)
  info = tmp_path / 'my_fl_plugin-0.1.dist-info'
  info.mkdir()
  (info / 'METADATA').write_text('Metadata-Version: 2.1\nName: my_fl_plugin\nVersion: 0.1\n')
  (info / 'entry_points.txt').write_text(entry_points.replace('"', ''))
  out = subprocess.run(
    [
      sys.executable,
      str(repo_root / 'binaries' / 'run.py'),
      '--algo=fedprox_pull',
      '--task=line',
      '--pull=0.5',
      '--rounds=20',
      f'--output_dir={tmp_path / "run"}',
    ],
    capture_output=True,
    text=True,
    timeout=300,
    cwd=repo_root,
    stdin=subprocess.DEVNULL,
    env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3', PYTHONPATH=str(tmp_path)),
  )
  assert out.returncode == 0, out.stderr
  with open(tmp_path / 'run' / 'metrics.csv') as f:
    mse = [float(row['eval/mse']) for row in csv.DictReader(f) if row['eval/mse']]
  assert mse[-1] < 0.1 * mse[0], mse  # it learns the line
  text = ' '.join(_help(repo_root, tmp_path).stdout.split())
  assert 'fedprox_pull: FedProx whose proximal strength is called the pull.' in text
  assert "--pull: strength of each client's pull toward the server model" in text
  assert '--line_clients: Task line (default 4): how many clients.' in text


SWEEP_PLUGIN = '''
from tff_comp.algorithms import fedprox
from tff_comp.binaries import reproductions


def sharp(model, *, client_learning_rate: float, batch_size: int = 10):
  """FedProx with a fixed pull."""
  return fedprox.fedprox(model, client_learning_rate=client_learning_rate, mu=0.5,
                         batch_size=batch_size)


def sharp_sweep():
  return reproductions.Reproduction(
      task='lasso', algorithms=('sharp', 'fedavg'), client_learning_rates=(1e-3, 3e-3),
      server_learning_rates=(1.0,), rounds=3, checkpoints=(3,), metric='f1',
      eval_period=3)
'''


@pytest.mark.slow  # a reproduction in a subprocess; the README's plugin runs by default
def test_a_plugin_registers_a_reproduction_grid_of_its_own_algorithm(repo_root, tmp_path):
  """reproduce.py sweeps a grid a plugin registers (entry point tff_comp.experiments),
  over the plugin's own algorithm beside a built-in one."""
  _install(
    tmp_path,
    'sweeper',
    '',
    """
      [tff_comp.algorithms]
      sharp = sweeper:sharp

      [tff_comp.experiments]
      sharp_sweep = sweeper:sharp_sweep
      """,
    source=SWEEP_PLUGIN,
  )
  out = subprocess.run(
    [
      sys.executable,
      str(repo_root / 'binaries' / 'reproduce.py'),
      '--experiment=sharp_sweep',
      f'--output_dir={tmp_path / "out"}',
    ],
    capture_output=True,
    text=True,
    timeout=300,
    cwd=repo_root,
    stdin=subprocess.DEVNULL,
    env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3', PYTHONPATH=str(tmp_path)),
  )
  assert out.returncode == 0, out.stderr
  table = (tmp_path / 'out' / 'sharp_sweep' / 'results.md').read_text()
  assert '| sharp |' in table and '| fedavg |' in table


def test_a_run_records_the_versions_of_the_packages_registering_plugins(tmp_path, monkeypatch):
  _install(
    tmp_path,
    'verplug',
    'eta_z: int = 2',
    """
      [tff_comp.algorithms]
      verplug = verplug:build_myplug
      """,
  )
  monkeypatch.syspath_prepend(str(tmp_path))
  assert registry.plugin_versions() == {'verplug': '0.1'}


def test_a_model_plugin_replaces_an_image_tasks_model(tmp_path, monkeypatch):
  """`registry.register_model` gives EMNIST (and CIFAR-100) a model by name: the run
  trains the plugin's Keras model; an unknown name is one line listing the known."""
  import numpy as np
  import tensorflow as tf

  from tff_comp import (
    experiment,
    registry,
  )

  def tiny(input_shape, num_classes, seed):
    del seed
    return tf.keras.Sequential(
      [
        tf.keras.layers.InputLayer(input_shape),
        tf.keras.layers.Conv2D(4, 3, strides=2),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(num_classes),
      ]
    )

  monkeypatch.setitem(
    registry.MODELS._entries,
    'tiny_cnn',
    registry.Entry('tiny_cnn', tiny, ()),
  )
  config = lambda model: experiment.ExperimentConfig.of(
    algorithm='fedavg',
    task='emnist',
    rounds=2,
    clients_per_round=2,
    eval_period=2,
    task_options=dict(source='synthetic', max_clients=4, model=model),
    output_dir=str(tmp_path / model),
  )
  prepared = experiment.prepare(config('tiny_cnn'))
  shapes = [tuple(w.shape) for w in prepared.task.model.initial_weights[0]]
  assert shapes == [(3, 3, 1, 4), (4,), (13 * 13 * 4, 62), (62,)]
  final = experiment.run_experiment(prepared, show_progress=False)
  assert np.isfinite(final['eval/test_loss'])
  with pytest.raises(experiment.ConfigError, match="unknown model 'tiny_cn'.*tiny_cnn"):
    experiment.prepare(config('tiny_cn'))
  # The common --model: the same for any task with a model option.
  common = experiment.prepare(
    experiment.ExperimentConfig.of(
      algorithm='fedavg',
      task='emnist',
      model='tiny_cnn',
      clients_per_round=2,
      output_dir=str(tmp_path / 'c'),
      task_options=dict(source='synthetic', max_clients=4),
    )
  )
  assert [tuple(w.shape) for w in common.task.model.initial_weights[0]] == shapes
  with pytest.raises(experiment.ConfigError, match='task .lasso. has no model option'):
    experiment.prepare(
      experiment.ExperimentConfig.of(
        algorithm='fedavg', task='lasso', model='tiny_cnn', output_dir=str(tmp_path / 'l')
      )
    )
  with pytest.raises(experiment.ConfigError, match='disagree'):
    experiment.prepare(
      experiment.ExperimentConfig.of(
        algorithm='fedavg',
        task='emnist',
        model='tiny_cnn',
        clients_per_round=2,
        output_dir=str(tmp_path / 'd'),
        task_options=dict(source='synthetic', max_clients=4, model='softmax'),
      )
    )


def test_a_model_from_a_file_or_module_without_a_package(tmp_path, monkeypatch):
  """`--model=path/to/file.py:function` or `module:function`: a model needed a plugin
  package before; a file or function that is not there is one line."""
  from tff_comp import experiment

  (tmp_path / 'my_models.py').write_text(
    'import tensorflow as tf\n\n'
    'def tiny(input_shape, num_classes, seed):\n'
    '  return tf.keras.Sequential([tf.keras.layers.InputLayer(input_shape),'
    ' tf.keras.layers.Flatten(), tf.keras.layers.Dense(num_classes)])\n'
  )
  monkeypatch.syspath_prepend(str(tmp_path))

  def prepare(model, **settings):
    return experiment.prepare(
      experiment.ExperimentConfig.of(
        algorithm='fedavg',
        task='emnist',
        model=model,
        clients_per_round=2,
        output_dir=str(tmp_path / 'run'),
        task_options=dict(source='synthetic', max_clients=4),
        **settings,
      )
    )

  for model in (f'{tmp_path}/my_models.py:tiny', 'my_models:tiny'):
    shapes = [tuple(w.shape) for w in prepare(model).task.model.initial_weights[0]]
    assert shapes == [(784, 62), (62,)], model
  for model, says in (
    (f'{tmp_path}/my_models.py:huge', "my_models.py has no function 'huge'"),
    (f'{tmp_path}/nowhere.py:tiny', 'does not load (FileNotFoundError: no file'),
    ('no_such_module:tiny', "does not load (ModuleNotFoundError: No module named 'no_such"),
    ('tiny', 'or give path/to/file.py:function or module:function'),
  ):
    with pytest.raises(experiment.ConfigError, match=re.escape(says)):
      prepare(model)
  # The file is an input of the run: edited, a resume is refused naming it.
  from_file = f'{tmp_path}/my_models.py:tiny'
  experiment.run_experiment(prepare(from_file, rounds=1), show_progress=False)
  with (tmp_path / 'my_models.py').open('a') as f:
    f.write('# edited\n')
  with pytest.raises(experiment.ConfigError, match='my_models.py'):
    prepare(from_file, rounds=2, resume=True)
