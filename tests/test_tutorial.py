"""docs/tutorial.md runs as written: its code blocks, in order, in one namespace, and
the algorithm it composes trains (its objective falls)."""

import contextlib
import io
import re


def test_the_tutorial_runs_as_written(repo_root):
  page = (repo_root / 'docs' / 'tutorial.md').read_text()
  blocks = re.findall(r'```python\n(.*?)```', page, re.S)
  assert len(blocks) >= 4
  namespace = {}
  said = io.StringIO()
  with contextlib.redirect_stdout(said):
    for block in blocks:
      exec(compile(block, 'docs/tutorial.md', 'exec'), namespace)
  out = said.getvalue()
  assert 'lasso' in out and 'clients' in out
  # Twenty rounds moved the model: the objective fell from the initial model's.
  task, np = namespace['task'], namespace['np']
  start = task.evaluate(
    tuple(np.asarray(w) for w in task.model.initial_weights[0]), task.regularizer
  )
  assert namespace['metrics']['train_objective'] < 0.5 * start['train_objective']
