"""Registry: duplicates, unknown names with suggestions, entry-point plugins."""

import os
import re
import subprocess
import sys
import types
from typing import Literal

import numpy as np
import pytest

from tff_comp import experiment, registry


def test_builtins_are_registered():
  assert {
    'fedavg',
    'fedprox',
    'fedmid',
    'fedmid_osp',
    'feddualavg',
    'feddualavg_osp',
    'fedavg_subgrad',
  } <= set(registry.ALGORITHMS.names())
  assert 'lasso' in registry.TASKS.names()


def test_duplicate_name_is_an_error():
  with pytest.raises(registry.RegistryError, match="'fedavg' is already registered"):
    registry.register_algorithm('fedavg')(lambda model: None)


def test_unknown_name_lists_names_and_closest():
  with pytest.raises(registry.RegistryError) as e:
    registry.get_algorithm('feddualavgg')
  message = str(e.value)
  assert "Did you mean 'feddualavg'?" in message
  assert 'fedprox' in message and 'fedmid' in message


def test_variants_fix_arguments_and_hide_them_from_flags():
  osp = registry.get_algorithm('fedmid_osp')
  assert osp.builder is registry.get_algorithm('fedmid').builder
  assert 'client_prox' not in [h.name for h in osp.hparams]
  assert not osp.accepts('client_prox') and osp.accepts('regularizer')
  assert dict(osp.fixed) == {'client_prox': False}


def test_hparams_come_from_keyword_only_signature():
  names = [h.name for h in registry.get_algorithm('fedprox').hparams]
  assert 'mu' in names and 'client_learning_rate' in names
  assert 'server_optimizer' not in names  # not a flag-friendly type


def test_an_option_is_typed_as_its_builder_declares_it():
  def build(
    model, *, rate: float = 0.1, steps: int = 1, exact: bool = True, kind: Literal['a', 'b'] = 'a'
  ):
    del model, rate, steps, exact, kind

  hparams = {h.name: h for h in registry.Entry('x', build).hparams}
  for name, given, taken in [
    ('rate', np.int64(2), 2.0),
    ('rate', np.float32(0.5), 0.5),
    ('steps', np.int32(3), 3),
    ('exact', np.bool_(False), False),
    ('kind', 'b', 'b'),
  ]:
    typed = hparams[name].typed(given)
    assert typed == taken and type(typed) is type(taken), (name, given, typed)
  for name, given, says in [
    ('rate', '0.1', "takes a number, got '0.1'."),
    ('rate', True, 'takes a number, got True.'),
    ('rate', float('inf'), 'must be a finite number, got inf.'),
    ('steps', 2.0, 'takes an integer, got 2.0.'),
    ('exact', 1, 'takes true or false, got 1.'),
    ('kind', 'c', "takes one of a, b; got 'c'."),
  ]:
    with pytest.raises(ValueError, match=f'^{re.escape(says)}$'):
      hparams[name].typed(given)


def test_entry_point_plugin_is_found(tmp_path, monkeypatch):
  """A package declaring `tff_comp.algorithms` / `tff_comp.tasks` entry points."""
  package = tmp_path / 'my_plugin'
  package.mkdir()
  (package / '__init__.py').write_text(
    'def build_my_algo(model, *, client_learning_rate: float, rho: float = 0.5):\n'
    '  return ("my_algo", rho)\n'
    'def build_my_task(*, size: int = 3):\n'
    '  return ("my_task", size)\n'
  )
  info = tmp_path / 'my_plugin-1.0.dist-info'
  info.mkdir()
  (info / 'METADATA').write_text('Metadata-Version: 2.1\nName: my_plugin\nVersion: 1.0\n')
  (info / 'entry_points.txt').write_text(
    '[tff_comp.algorithms]\nmy_algo = my_plugin:build_my_algo\n'
    '[tff_comp.tasks]\nmy_task = my_plugin:build_my_task\n'
  )
  monkeypatch.syspath_prepend(str(tmp_path))
  algorithms = registry.Registry('algorithm', registry.ALGORITHMS_GROUP, 'tff_comp.algorithms')
  tasks = registry.Registry('task', registry.TASKS_GROUP, 'tff_comp.tasks')
  entry = algorithms.get('my_algo')
  assert entry.builder(None, client_learning_rate=0.1) == ('my_algo', 0.5)
  assert [h.name for h in entry.hparams] == ['client_learning_rate', 'rho']
  assert tasks.get('my_task').builder() == ('my_task', 3)
  monkeypatch.delitem(sys.modules, 'my_plugin', raising=False)


def test_a_script_beside_its_own_tasks_py_sees_every_task(tmp_path):
  """tff_comp's tasks install as tff_comp.tasks: a user's tasks.py shadows nothing."""
  (tmp_path / 'tasks.py').write_text('raise RuntimeError("the user\'s own module")\n')
  (tmp_path / 'binaries.py').write_text('raise RuntimeError("the user\'s own module")\n')
  (tmp_path / 'script.py').write_text(
    'from tff_comp import registry\nprint(",".join(registry.TASKS.names()))\n'
  )
  out = subprocess.run(
    [sys.executable, 'script.py'],
    cwd=tmp_path,
    capture_output=True,
    text=True,
    timeout=300,
    env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3'),
  )
  assert out.returncode == 0, out.stderr[-2000:]
  assert {'lasso', 'nuclear', 'synthetic', 'dominant_class'} <= set(out.stdout.strip().split(','))


def test_every_option_flag_says_what_it_does():
  """Every option that becomes a run.py flag (beyond the common flags) is described in
  its builder's `Args:` section, which is the flag's help."""
  missing = []
  for get, names, common in (
    (registry.get_algorithm, registry.ALGORITHMS.names(), experiment.COMMON_ALGORITHM_ARGS),
    (registry.get_task, registry.TASKS.names(), experiment.COMMON_TASK_ARGS),
  ):
    for name in names:
      entry = get(name)
      missing += [
        f'{name}: {h.name}'
        for h in entry.hparams
        if h.name not in common and not entry.option_help(h.name)
      ]
  assert not missing


def test_args_sections_parse():
  doc = """Builds it.

  Args:
    alpha: the first
      option, on two lines.
    beta (float): the second.

  Returns:
    gamma: not an argument.
  """
  assert registry.arg_docs(doc) == {
    'alpha': 'the first option, on two lines.',
    'beta': 'the second.',
  }
  assert registry.arg_docs('No sections.') == {} == registry.arg_docs(None)


def test_a_summary_is_the_first_sentence_whole_past_abbreviations():
  """`--helpfull` lists each task by its summary: 'Caldas et al. 2018' is not the end of
  a sentence (it cut the descriptions there)."""
  for name in registry.TASKS.names():
    summary = registry.get_task(name).summary
    assert not summary.endswith(('et al.', 'e.g.', 'i.e.')), (name, summary)
  assert 'Caldas et al. 2018' in registry.get_task('emnist').summary
  assert 'Reddi et al. 2021' in registry.get_task('cifar100').summary


def test_tasks_implement_the_librarys_task_contract(tmp_path, monkeypatch):
  """The built-in tasks implement `tff_comp.task.Task`; a plugin's task builder returning
  an object without a member the library reads is refused in one line naming it."""
  from tff_comp import experiment, task

  for name in ('lasso', 'quadratic', 'sinewave'):
    built = experiment.prepare(
      experiment.ExperimentConfig.of(algorithm='fedavg', task=name, output_dir=str(tmp_path / name))
    ).task
    assert isinstance(built, task.Task) and not task.missing(built), name

  monkeypatch.setattr(registry.TASKS, '_entries', dict(registry.TASKS._entries))

  @registry.register_task('lacks_evaluate_many')
  def _lacking(*, seed: int = 0):
    whole = registry.get_task('quadratic').builder(seed=seed)
    return types.SimpleNamespace(
      **{k: getattr(whole, k) for k in task.missing(object()) if k != 'evaluate_many'}
    )

  with pytest.raises(
    experiment.ConfigError,
    match=r"task 'lacks_evaluate_many': its builder returned a"
    r' SimpleNamespace without evaluate_many \(tff_comp.task.Task\)',
  ):
    experiment.prepare(
      experiment.ExperimentConfig.of(
        algorithm='fedavg', task='lacks_evaluate_many', output_dir=str(tmp_path / 'x')
      )
    )
