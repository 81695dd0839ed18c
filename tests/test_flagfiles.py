"""Every example flagfile in experiments/ is a valid run.py configuration (one per
reproduction, at its best configuration); each is parsed and validated as run.py does,
short of training."""

import pathlib

from absl import flags
import pytest

from tff_comp import experiment
from tff_comp.binaries import flags_lib
from tff_comp.binaries import run

FLAGFILES = sorted((pathlib.Path(__file__).resolve().parent.parent / 'experiments').glob(
    '*.flags'))


def test_one_flagfile_per_reproduction(repo_root):
  """Each committed reproduction (results/<name>/) has a flagfile that names it."""
  reproductions = [d.name for d in (repo_root / 'results').iterdir() if d.is_dir()]
  texts = [f.read_text() for f in FLAGFILES]
  assert reproductions and len(FLAGFILES) >= len(reproductions)
  assert all('reproduction' in text for text in texts)
  assert all(any(f'results/{name})' in text for text in texts)
             for name in reproductions), reproductions


@pytest.mark.parametrize('path', FLAGFILES, ids=[f.stem for f in FLAGFILES])
def test_flagfile_is_a_valid_configuration(path, repo_root, monkeypatch):
  monkeypatch.chdir(repo_root)  # flagfiles name each other relative to the repository
  flags.FLAGS.unparse_flags()
  flags_lib.parse_or_fail(['run.py', f'--flagfile={path}'])
  config = flags_lib.config_from_flags(flags.FLAGS, run._ALGO_FLAGS, run._TASK_FLAGS)  # pylint: disable=protected-access
  prepared = experiment.prepare(config)
  assert prepared.config.output_dir == f'runs/{path.stem}'
  assert prepared.settings['rounds'] >= 100
