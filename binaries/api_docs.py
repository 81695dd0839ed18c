"""Builds the API reference from the docstrings (pdoc): `make docs` writes build/api/
(open build/api/index.html). Exits 1 naming every warning pdoc gives (a name that does
not resolve, a module that does not import), so CI keeps the reference whole.

    python binaries/api_docs.py [--output_dir=build/api]
"""

import importlib
import os

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')

import pathlib
import pkgutil
import sys
import warnings

from absl import app, flags
import pdoc

import tff_comp
from tff_comp.binaries import closed_stdout

_OUTPUT = flags.DEFINE_string('output_dir', 'build/api', 'Where the HTML goes.')


def modules() -> list[str]:
  """What pdoc is given: tff_comp and its tasks, and the modules pdoc would skip: those
  a package's `__all__` leaves out (the binaries are scripts, documented by their own
  --help)."""
  specs, packages = ['tff_comp', 'tff_comp.tasks'], ['tff_comp', 'tff_comp.tasks']
  while packages:
    package = importlib.import_module(packages.pop())
    listed = getattr(package, '__all__', None)
    for info in pkgutil.iter_modules(package.__path__, f'{package.__name__}.'):
      if info.name.startswith('tff_comp.binaries'):
        continue
      if listed is not None and info.name.rsplit('.', 1)[1] not in listed:
        specs.append(info.name)
      if info.ispkg:
        packages.append(info.name)
  return specs


@closed_stdout.closing_stdout_quietly
def main(argv: list[str]) -> None:
  del argv
  for name in tff_comp.__all__:  # the lazy exports, loaded for pdoc to see
    getattr(tff_comp, name)
  with warnings.catch_warnings(record=True) as said:
    warnings.simplefilter('always')
    pdoc.pdoc(*modules(), output_directory=pathlib.Path(_OUTPUT.value))
  problems = [w for w in said if 'pdoc' in w.filename]
  for w in problems:
    print(f'api_docs.py: {w.message}', file=sys.stderr)
  if problems:
    sys.exit(1)
  print(f'wrote {_OUTPUT.value}/index.html ({len(modules())} modules)')


if __name__ == '__main__':
  app.run(main)
