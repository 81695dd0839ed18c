"""The layout's promises, checked: no module over 500 lines, and docs/architecture.md's
tree naming every module there is and none that is not (a promise nothing checks decays
within hours: four modules passed 500 lines in a day); and setup.cfg listing every
package."""

import configparser
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
MAX_LINES = 500
# The library and its binaries; tests and data are not held to the limit.
CODE = ('tff_comp', 'binaries', 'tasks')


def _modules() -> list[pathlib.Path]:
  return sorted(
    p.relative_to(ROOT)
    for folder in CODE
    for p in (ROOT / folder).rglob('*.py')
    if '__pycache__' not in p.parts
  )


def _tree() -> str:
  """The code block of docs/architecture.md that draws the tree (it starts at tff_comp/)."""
  text = (ROOT / 'docs' / 'architecture.md').read_text()
  blocks = re.findall(r'```\n(.*?)```', text, re.DOTALL)
  return next(b for b in blocks if b.startswith('tff_comp/'))


def _described(tree: str) -> tuple[set[str], set[str]]:
  """(the module paths the tree names, the folders it describes as holding one module
  per entry). An entry line is indented two spaces under its folder's; a deeper line
  continues the entry above it. A name on an entry (or its continuation) is in the
  entry's folder; on a folder's own line, in that folder (`binaries/  run.py, ...`)."""
  named, per_entry = set(), set()
  stack: list[tuple[int, str]] = []  # (indent, path) of the open folders
  where, last_indent, folder = '', -2, False
  for line in tree.splitlines():
    if not line.strip():
      continue
    indent = len(line) - len(line.lstrip())
    if indent <= last_indent + 2:  # an entry: a module, modules, or a folder
      stack = [(i, f) for i, f in stack if i < indent]
      where = stack[-1][1] if stack else ''
      first = line.split()[0]
      folder = first.endswith('/')
      if folder:
        stack.append((indent, where + first))
        where = where + first
      last_indent = indent
    if folder and 'one module per' in line:  # on the folder's line or its continuation
      per_entry.add(where)
    for name in re.findall(r'(?<![\w./])(\w+\.py)\b', line):
      named.add(where + name)
  return named, per_entry


def test_no_module_is_over_500_lines():
  over = {
    str(p): n for p in _modules() if (n := len((ROOT / p).read_text().splitlines())) > MAX_LINES
  }
  assert not over, f'modules over {MAX_LINES} lines (split them by concept): {over}'


def test_the_architecture_tree_names_every_module_and_only_those():
  named, per_entry = _described(_tree())
  modules = {
    str(p)
    for p in _modules()
    if p.name != '__init__.py' and not any(str(p).startswith(f) for f in per_entry)
  }
  shown = named
  assert not modules - shown, f'modules missing from the tree: {sorted(modules - shown)}'
  assert not shown - {str(p) for p in _modules()}, (
    f'the tree names modules that are not there: {sorted(shown - {str(p) for p in _modules()})}'
  )
  assert per_entry, 'no folder described as one module per algorithm, task or block'


def test_setup_cfg_lists_every_package():
  """setup.cfg names its packages one by one (tasks/ and binaries/ are mapped into
  tff_comp); a package left out is missing from an installed wheel, as
  `tff_comp.ops.aggregators` was, unseen by an editable install."""
  setup = configparser.ConfigParser()
  setup.read(ROOT / 'setup.cfg')
  listed = set(setup['options']['packages'].split())
  mapped = {'tasks': 'tff_comp.tasks', 'binaries': 'tff_comp.binaries'}
  found = set()
  for folder in CODE:
    for init in (ROOT / folder).rglob('__init__.py'):
      parts = init.parent.relative_to(ROOT).parts
      found.add('.'.join((mapped.get(parts[0], parts[0]), *parts[1:])))
  assert found == listed, f'not listed: {found - listed}; listed, not packages: {listed - found}'
