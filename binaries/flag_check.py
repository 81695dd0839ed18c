"""A binary's flags checked before TensorFlow loads, so a bad flag costs well under a second.

Defining the flags needs the registry (algorithm and task flags come from the builders'
signatures) and importing the builders loads TensorFlow and TFF (5-7 s on the project's
machines). So when a binary parses its flags it records them (name, kind, choices,
bounds) in a manifest under the cache directory; at its next start `check` parses the
command line against that manifest with absl alone, before anything heavy is imported,
and an unknown flag, an unparsable value or a bad flagfile exits 2 with one line. The
manifest is keyed by what defines the flags (tff_comp's source files and the installed
plugins' entry points), so a changed flag set is never checked against a stale one;
without a current manifest the check passes and the full parse reports errors as
before.
"""

from collections.abc import Callable
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import pathlib
import sys
import tempfile

from absl import flags

from tff_comp import (
  paths,
  registry,  # stdlib only: the plugin groups' names
  settings,  # stdlib only
)

# absl's help flags.
_HELP = ('--help', '--helpfull', '--helpshort', '-h', '-?', '--help=true', '--helpfull=true')
_KINDS = {
  'bool': flags.DEFINE_bool,
  'string': flags.DEFINE_string,
  'multi_string': flags.DEFINE_multi_string,
  'list': flags.DEFINE_list,
}
_PACKAGES = ('tff_comp', 'tff_comp.tasks', 'tff_comp.binaries')


def _sources(package: str) -> list[pathlib.Path]:
  """The .py files of a top-level module or package (found without importing it)."""
  spec = importlib.util.find_spec(package)
  if spec is None:
    return []
  if spec.submodule_search_locations:
    return sorted(
      p for folder in spec.submodule_search_locations for p in pathlib.Path(folder).rglob('*.py')
    )
  return [pathlib.Path(spec.origin)] if spec.origin else []


def _fingerprint(binary: str) -> str:
  """A hash of what defines the binary's flags: the files (path, size, modification
  time) of tff_comp's packages and of every plugin's package, and the plugins' entry
  points."""
  digest = hashlib.sha256(binary.encode())
  packages = set(_PACKAGES)
  for group in registry.GROUPS:
    for point in importlib.metadata.entry_points(group=group):
      digest.update(f'{group}:{point.name}={point.value};'.encode())
      packages.add(point.module.split('.')[0])
  for package in sorted(packages):
    for path in _sources(package):
      stat = path.stat()
      digest.update(f'{path}:{stat.st_size}:{stat.st_mtime_ns};'.encode())
  return digest.hexdigest()[:20]


def _manifest(binary: str) -> pathlib.Path:
  return paths.cache_root() / 'flags' / f'{binary}-{_fingerprint(binary)}.json'


def _describe(flag: flags.Flag) -> dict:
  kind = flag.flag_type()
  entry = {'kind': kind}
  if getattr(flag.parser, 'enum_values', None):  # absl's kind: 'string enum'
    entry['kind'], entry['choices'] = 'enum', list(flag.parser.enum_values)
  for bound in ('lower_bound', 'upper_bound'):
    if getattr(flag.parser, bound, None) is not None:
      entry[bound] = getattr(flag.parser, bound)
  return entry


def record(
  flag_values: flags.FlagValues,
  binary: str,
  bounds: dict[str, dict[str, float | None]] | None = None,
  help_text: Callable[[], str] | None = None,
) -> None:
  """Writes the manifest of `flag_values` (every flag the binary defines), with the
  settings' `bounds` by flag (lower, upper, above: `settings.check_bounds`), and the
  binary's `help_text()` beside it (`--help` at the next start, before TensorFlow
  loads), atomically; a cache directory that cannot be written only costs the fast
  check."""
  target = _manifest(binary)
  if target.exists():
    return
  described = {name: _describe(flag_values[name]) for name in flag_values}
  for name, limits in (bounds or {}).items():
    if name in described:
      described[name]['bounds'] = limits
  try:
    target.parent.mkdir(parents=True, exist_ok=True)
    if help_text is not None:  # first: a manifest is only ever found with its help
      _write(_help_file(binary), help_text())
    _write(target, json.dumps(described))
  except OSError:
    pass


def _write(path: pathlib.Path, text: str) -> None:
  with tempfile.NamedTemporaryFile('w', dir=path.parent, delete=False) as f:
    f.write(text)
  os.replace(f.name, path)


def _help_file(binary: str) -> pathlib.Path:
  return _manifest(binary).with_suffix('.help')


def asks_help(argv: list[str]) -> bool:
  """Whether `argv` asks for the binary's help (absl's help flags)."""
  return any(arg.split('=')[0] in _HELP for arg in argv[1:])


def _define(name: str, entry: dict, flag_values: flags.FlagValues) -> None:
  kind, bounds = entry['kind'], {k: entry[k] for k in ('lower_bound', 'upper_bound') if k in entry}
  if kind == 'enum':
    flags.DEFINE_enum(name, None, entry['choices'], '', flag_values=flag_values)
  elif kind in ('int', 'float'):
    define = flags.DEFINE_integer if kind == 'int' else flags.DEFINE_float
    define(name, None, '', flag_values=flag_values, **bounds)
  else:  # strings, lists and any other kind: every value parses
    _KINDS.get(kind, flags.DEFINE_string)(name, None, '', flag_values=flag_values)


def fail(message) -> None:
  """Exits with status 2 and `message` as one line on stderr (the binaries' bad input)."""
  print(
    f'{os.path.basename(sys.argv[0])}: error: {" ".join(str(message).split())}', file=sys.stderr
  )
  sys.exit(2)


_MAX_FLAG_NAME = 200  # longer names are no flag (absl's suggestions recursed on them)


def _flagfiles(args: list[str]) -> list[str]:
  """The files named by --flagfile (or -flagfile) in `args`."""
  files = []
  for i, arg in enumerate(args):
    name, has_value, value = arg.lstrip('-').partition('=')
    if arg.startswith('-') and name == 'flagfile':
      if has_value:
        files.append(value)
      elif i + 1 < len(args):
        files.append(args[i + 1])
  return files


def check_shape(argv: list[str]) -> None:
  """Exits 2 with one line (`fail`) for what absl handles badly: a flag name too long to
  be one (absl's suggestions raised RecursionError) and a flagfile that includes itself,
  directly or through others (absl warned and ran on)."""
  for arg in argv[1:]:
    name = arg.lstrip('-').split('=')[0]
    if arg.startswith('-') and len(name) > _MAX_FLAG_NAME:
      fail(f'unknown flag --{name[:40]}... (a name of {len(name)} characters).')

  def visit(path: str, chain: tuple[str, ...]) -> None:
    resolved = os.path.realpath(os.path.expanduser(path))
    if resolved in chain:
      through = ' -> '.join(os.path.basename(p) for p in (*chain, resolved))
      fail(f'--flagfile={path} includes itself ({through}).')
    try:
      lines = [line.strip() for line in pathlib.Path(resolved).read_text().splitlines()]
    except (OSError, UnicodeDecodeError):
      return  # absl reports what it cannot read
    flag_lines = [line for line in lines if not line.startswith(('#', '//'))]
    for included in _flagfiles(flag_lines):  # as absl reads them: relative to the cwd
      visit(included, (*chain, resolved))

  for path in _flagfiles(argv[1:]):
    visit(path, ())


def check(argv: list[str], binary: str) -> None:
  """Parses `argv` against the binary's manifest, if a current one exists; a bad flag,
  value or flagfile exits 2 with one line (`fail`), and `--help` prints the recorded
  help and exits 0. `check_shape` first, manifest or not."""
  check_shape(argv)
  try:
    described = json.loads(_manifest(binary).read_text())
  except (OSError, ValueError):
    return
  if asks_help(argv):
    try:
      print(_help_file(binary).read_text())
    except OSError:
      return  # the full parse prints it
    sys.exit(0)
  flag_values = flags.FlagValues()
  for name, entry in described.items():
    if name not in flag_values:
      _define(name, entry, flag_values)
  try:
    flag_values(list(argv))
  except UnicodeDecodeError as e:
    fail(f'a --flagfile is not a text file of flags ({e}).')
  except (flags.Error, OSError) as e:
    fail(e)
  for name, entry in described.items():
    value = flag_values[name].value
    if 'bounds' in entry and isinstance(value, (int, float)) and not isinstance(value, bool):
      try:
        settings.check_bounds(name, value, **entry['bounds'])
      except ValueError as e:
        fail(e)


def program() -> str:
  """The running binary's name, as manifests key it."""
  return pathlib.Path(sys.argv[0]).stem
