"""docs/tutorial.md runs as written: its code blocks, in order, in one namespace, print
what its text blocks show, and the algorithm it composes trains (its objective falls)."""

import ast
import contextlib
import io
import math
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
  shown = [line for b in re.findall(r'```text\n(.*?)```', page, re.S) for line in b.splitlines()]
  printed = [line for line in out.splitlines() if line.strip()]
  assert len(printed) >= len(shown) == 5, (printed, shown)
  for expected, got in zip(shown, printed):
    if expected.startswith('inprocess on'):  # the machine's threads may differ
      assert got.startswith(expected.split(' on ')[0] + ' on ') and 'engine' in got, got
    elif '{' in expected:  # floats: within 2%, as another machine's float math may differ
      label, values = expected.split('{', 1)
      got_label, got_values = got.split('{', 1)
      want, have = ast.literal_eval('{' + values), ast.literal_eval('{' + got_values)
      assert got_label == label and want.keys() == have.keys(), got
      assert all(math.isclose(have[k], want[k], rel_tol=0.02) for k in want), (got, expected)
    else:
      assert got == expected
  # Twenty rounds moved the model: the objective fell from the initial model's.
  task, np = namespace['task'], namespace['np']
  start = task.evaluate(
    tuple(np.asarray(w) for w in task.model.initial_weights[0]), task.regularizer
  )
  assert namespace['metrics']['train_objective'] < 0.5 * start['train_objective']
