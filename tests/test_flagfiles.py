"""Every example flagfile in experiments/ is a valid run.py configuration (one per
reproduction, at its best configuration): each is parsed and validated as run.py does,
short of training, in one fresh interpreter (run.py's flags would clash with another
binary's imported by a test in this one); flagfiles of the same task settings share
its build."""

import json
import os
import pathlib
import subprocess
import sys

FLAGFILES = sorted((pathlib.Path(__file__).resolve().parent.parent / 'experiments').glob('*.flags'))
_CHECK = """
import json, sys
from absl import flags
from tff_comp import experiment
from tff_comp.binaries import flags_lib, run
results, built = {}, {}
for path in sys.argv[1:]:
  flags.FLAGS.unparse_flags()
  flags_lib.parse_or_fail(['run.py', '--flagfile=' + path])
  config = flags_lib.config_from_flags(flags.FLAGS, run._ALGO_FLAGS, run._TASK_FLAGS)
  # A task built once per task settings, as a grid's trials share theirs (seven
  # flagfiles share synthetic EMNIST's 1,000 writers).
  task = json.dumps([config.task, config.task_options, config.task_seed], sort_keys=True)
  prepared = experiment.prepare(config, like=built.get(task))
  built.setdefault(task, prepared)
  results[path] = [prepared.config.output_dir, prepared.settings.rounds]
print(json.dumps(results))
"""


def test_one_flagfile_per_reproduction(repo_root):
  """Each committed reproduction (results/<name>/) has a flagfile that names it."""
  reproductions = [d.name for d in (repo_root / 'results').iterdir() if d.is_dir()]
  texts = [f.read_text() for f in FLAGFILES]
  assert reproductions and len(FLAGFILES) >= len(reproductions)
  assert all('reproduction' in text for text in texts)
  assert all(any(f'results/{name})' in text for text in texts) for name in reproductions), (
    reproductions
  )


def test_every_flagfile_is_a_valid_configuration(repo_root):
  out = subprocess.run(
    [sys.executable, '-c', _CHECK, *map(str, FLAGFILES)],
    capture_output=True,
    text=True,
    timeout=300,
    cwd=repo_root,
    stdin=subprocess.DEVNULL,
    env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3'),
  )
  assert out.returncode == 0, out.stderr
  results = json.loads(out.stdout.strip().splitlines()[-1])
  for path in FLAGFILES:
    output_dir, rounds = results[str(path)]
    assert output_dir == f'runs/{path.stem}' and rounds >= 100
