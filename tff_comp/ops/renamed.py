"""Names kept importable for one version after a rename (CHANGELOG.md): a module sets
`__getattr__ = renamed.module_getattr(__name__, {'Old': 'New'})`, and the old name
still imports, with a DeprecationWarning naming the new one."""

from collections.abc import Callable, Mapping
import sys
from typing import Any
import warnings


def module_getattr(module: str, renames: Mapping[str, str]) -> Callable[[str], Any]:
  """A module `__getattr__` (PEP 562) serving `renames` {old name: new name}."""
  short = module.rsplit('.', 1)[-1]

  def getattr_(name: str) -> Any:
    if name in renames:
      warnings.warn(f'{short}.{name} is renamed {short}.{renames[name]}.',
                    DeprecationWarning, stacklevel=2)
      return getattr(sys.modules[module], renames[name])
    raise AttributeError(f'module {module!r} has no attribute {name!r}')

  return getattr_
