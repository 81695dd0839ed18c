"""A run's directory: whether a run may write there, whether a recorded run may be
resumed with these settings, and the environment config.json records.

The files themselves are written by the training loop (`run.training_loop`).
"""

from collections.abc import Mapping, Sequence
import errno
import functools
import importlib.metadata
import json
import os
import pathlib
import platform
import shlex
import shutil
import subprocess
import sys
import threading
from typing import Any

from tff_comp import paths, registry
from tff_comp.config import experiment_config
from tff_comp.settings import ConfigError

RUN_FILES = ('metrics.csv', 'config.json', 'tensorboard', 'checkpoints', 'final_model.npz')
# Of those, the directories: a plain file in their place stops the run's writes.
RUN_DIRS = ('tensorboard', 'checkpoints')
# Records of config.json a resumed run may change besides its resumable settings
# (`settings.setting(resumable=True)`): the runtime's (an engine that fell back records
# it) and the environment's (its input files are compared apart, `_check_inputs`).
_RESUMABLE_RECORDS = ('runtime_record', 'environment')
# Resolved at training time from what is compared already (`client_hparams`: from the
# algorithm options, learning rates and a grid's configuration; `server_hparams`: from
# the server optimizer's settings, and absent from runs recorded before 0.3.0 had it).
_RESUMABLE_RESOLVED = ('rounds', 'runtime', 'client_hparams', 'server_hparams')


# Room for the longest name a run writes under its directory (TensorBoard's event files
# name the host and pid; checkpoints and temporary files their round and pid).
_ROOM_FOR_FILES = 128


def _check_length(path: pathlib.Path) -> None:
  """ConfigError for a path the file system cannot hold (a component over NAME_MAX, or
  no room under PATH_MAX for the run's files): it failed with `OSError: [Errno 36]` after
  the run had started."""
  try:
    name_max, path_max = os.pathconf('/', 'PC_NAME_MAX'), os.pathconf('/', 'PC_PATH_MAX')
  except (OSError, ValueError):
    name_max, path_max = 255, 4096
  absolute = path.absolute()
  longest = max(absolute.parts, key=len)
  if len(longest.encode()) > name_max:
    raise ConfigError(
      f'--output_dir: the name {longest[:40]}... has {len(longest.encode())}'
      f' bytes; a name here holds at most {name_max}.'
    )
  if len(str(absolute).encode()) + _ROOM_FOR_FILES > path_max:
    raise ConfigError(
      f'--output_dir: the path has {len(str(absolute).encode())} bytes;'
      f" with the run's files under it, it must stay under"
      f' {path_max - _ROOM_FOR_FILES}.'
    )


def run_files(path: pathlib.Path) -> list[str]:
  """The `RUN_FILES` a directory holds (none: it holds no run)."""
  return [name for name in RUN_FILES if (path / name).exists()]


def check_output_dir(
  output_dir: str | os.PathLike, overwrite: bool = False, resume: bool = False
) -> None:
  """Raises ConfigError unless a run can write to `output_dir` without touching
  anything: creates nothing. A directory holding another run (any of `RUN_FILES`) is
  refused unless `overwrite` or `resume` (`check_resumable` then compares the
  configurations)."""
  path = pathlib.Path(output_dir)
  _check_length(path)
  if path.exists() and not path.is_dir():
    raise ConfigError(f'--output_dir={path} is a file, not a directory.')
  if path.is_dir():
    found = run_files(path)
    blocked = [name for name in RUN_DIRS if name in found and not (path / name).is_dir()]
    if blocked:
      raise ConfigError(
        f'--output_dir={path}: {path / blocked[0]} is a file where the run keeps a'
        ' directory; move it away.'
      )
    if found and not (overwrite or resume):
      raise ConfigError(
        f'--output_dir={path} holds another run ({", ".join(found)}); choose another'
        ' directory, pass --resume to continue it or --overwrite to replace it.'
      )
    existing = path
  else:
    existing = next(p for p in path.absolute().parents if p.exists())
    if not existing.is_dir():
      raise ConfigError(f'--output_dir={path} is under {existing}, which is a file.')
  if not os.access(existing, os.W_OK | os.X_OK):
    raise ConfigError(f'--output_dir={path}: {existing} is not writable.')


def check_resumable(
  output_dir: pathlib.Path,
  config: dict[str, Any],
  force: bool = False,
  extra_later: bool = False,
  inputs: Mapping[str, Any] | None = None,
) -> None:
  """Raises ConfigError if the run recorded in `output_dir` was configured otherwise
  than `config` (besides its resumable settings), read other input files than `inputs`
  ({path: fingerprint}, `paths.fingerprint`; None: not checked) or holds a run
  (metrics, checkpoints) whose config.json is gone, unless `force`. Nothing there:
  nothing to check. `extra_later`: records the caller adds to config.json later (a
  grid's) are checked then, not now: recorded top-level entries `config` lacks are left
  aside."""
  try:
    recorded = json.loads((output_dir / 'config.json').read_text())
  except FileNotFoundError:
    if force or not (
      (output_dir / 'metrics.csv').exists() or any((output_dir / 'checkpoints').glob('state_*.npz'))
    ):
      return
    raise ConfigError(
      f'--resume: {output_dir} holds a run but not its config.json, so'
      ' its settings cannot be checked against these; --force_resume'
      ' continues it with these settings all the same.'
    ) from None
  except ValueError as e:
    raise ConfigError(f'--resume: {output_dir / "config.json"} is unreadable ({e}).') from e
  recorded = experiment_config.upgrade(recorded)  # an earlier version's layout, today's
  if inputs is not None and isinstance(recorded.get('environment'), dict):
    _check_inputs(output_dir, recorded['environment'].get('data_files') or {}, inputs)

  def flat(values, prefix=''):  # {'algorithm_options': {'mu': 1}} -> algorithm_options.mu
    out = {}
    for key, value in values.items():
      out.update(
        flat(value, f'{prefix}{key}.') if isinstance(value, dict) else {f'{prefix}{key}': value}
      )
    return out

  resumable = (*experiment_config.declared('resumable'), *_RESUMABLE_RECORDS)

  # Input files are compared by content (`_check_inputs`), not by the path naming them:
  # a path's setting is compared without it (a model file's function kept).
  named = set()
  for c in (recorded, config):
    try:
      named.update(experiment_config.ExperimentConfig.from_dict(c).input_files())
    except (TypeError, ValueError, KeyError):
      pass

  def unnamed(value):
    if isinstance(value, str):
      path, colon, function = value.rpartition(':')
      if value in named or (colon and path in named):
        return f'<an input file>{colon}{function if colon else ""}'
    return value

  def comparable(c):  # (settings, resolved settings), flat, less what may change
    c = {k: unnamed(v) for k, v in flat(json.loads(json.dumps(c, default=str))).items()}

    def free(key, names):  # `key` is one of `names` or inside one
      return any(key == n or key.startswith(f'{n}.') for n in names)

    kept = {k: v for k, v in c.items() if not k.startswith('resolved.') and not free(k, resumable)}
    resolved = {k[len('resolved.') :]: v for k, v in c.items() if k.startswith('resolved.')}
    return kept, {k: v for k, v in resolved.items() if not free(k, _RESUMABLE_RESOLVED)}

  if extra_later:
    recorded = {k: v for k, v in recorded.items() if k in config}
  (old, old_resolved), (new, new_resolved) = comparable(recorded), comparable(config)
  differ = {}  # name -> (recorded, now); a resolved value over the flag it came from
  for before, after in ((old, new), (old_resolved, new_resolved)):
    for key in sorted(before.keys() | after.keys()):
      if before.get(key) != after.get(key):
        differ[key] = (before.get(key), after.get(key))
      elif key in differ and before is old_resolved:  # given otherwise, the same in force
        del differ[key]
  if differ:
    changes = '; '.join(f'{k}: recorded {a!r}, now {b!r}' for k, (a, b) in differ.items())
    raise ConfigError(
      f'--resume: the run in {output_dir} was configured differently'
      f' ({changes}); resume it with its own settings, choose another'
      f' --output_dir, or delete {output_dir} to start it afresh.'
    )


def _check_inputs(
  output_dir: pathlib.Path, recorded: Mapping[str, Any], inputs: Mapping[str, Any]
) -> None:
  """Raises ConfigError naming the first input file whose fingerprint differs between
  the recorded run and this one (a device trace edited between a run and its resume
  trained the resumed rounds on the new trace)."""
  recorded, inputs = dict(recorded), dict(inputs)
  # The same file named from another folder or by its absolute path: one path each
  # side, not the other's, with one content.
  for path in [p for p in inputs if p not in recorded]:
    twin = next((q for q in recorded if q not in inputs and recorded[q] == inputs[path]), None)
    if twin is not None:
      del recorded[twin], inputs[path]
  for path in sorted(recorded.keys() | inputs.keys()):
    before, now = recorded.get(path), inputs.get(path)
    if before == now:
      continue
    if now is None:
      what = 'this run does not read it (missing, or another file in its place)'
    elif before is None:
      what = 'the recorded run did not read it'
    elif before.get('bytes') != now.get('bytes'):
      what = f'{before.get("bytes")} bytes then, {now.get("bytes")} now'
    else:
      what = 'its content differs'
    raise ConfigError(
      f'--resume: {path}, an input of the run in {output_dir}, changed since'
      f' the run was recorded ({what}); restore it, or start a new run'
      ' (--overwrite or another --output_dir).'
    )


def input_files(named: Sequence[str], data_files: Mapping[str, Any]) -> dict[str, Any]:
  """{path: fingerprint} of the files a run reads (`paths.fingerprint`): the task's
  `data_files` and the files its settings name (`named`); a named file that cannot be
  read is left to its setting's own check, which names it."""
  files = dict(data_files)
  for path in named:
    try:
      files[path] = paths.fingerprint(pathlib.Path(path))
    except OSError:
      continue
  return files


def recorded_runtime(output_dir: str | os.PathLike) -> dict[str, Any] | None:
  """The runtime record of the run in `output_dir` (None: none recorded or readable)."""
  try:
    recorded = json.loads((pathlib.Path(output_dir) / 'config.json').read_text())
    return recorded.get('runtime_record') or None
  except (OSError, ValueError, AttributeError):
    return None


_ENVIRONMENT_LOCK = threading.Lock()


def environment() -> dict[str, Any]:
  """Versions of what ran (tff_comp, TensorFlow, TFF, NumPy, Python, packages of
  plugins), the command line of the process and, run from a git checkout, its commit
  and whether the tree had uncommitted changes. Read once a process (two git calls and
  every package's entry points), not once for each trial of a grid, whose
  threads ask at once."""
  with _ENVIRONMENT_LOCK:
    return _read_environment()


@functools.cache
def _read_environment() -> dict[str, Any]:
  import numpy as np
  import tensorflow as tf
  import tensorflow_federated as tff

  record = {
    'tff_comp': importlib.metadata.version('tff_comp'),
    'tensorflow': tf.__version__,
    'tensorflow_federated': tff.__version__,
    'numpy': np.__version__,
    'python': platform.python_version(),
    'plugins': registry.plugin_versions(),
    'command': shlex.join([os.path.basename(sys.executable), *sys.argv]),
  }
  checkout = pathlib.Path(__file__).resolve().parents[2]
  if (checkout / '.git').exists():

    def git(*args):
      return subprocess.run(
        ['git', '-C', str(checkout), *args], capture_output=True, text=True, timeout=30, check=False
      ).stdout.strip()

    record['git_commit'] = git('rev-parse', 'HEAD')
    record['git_dirty'] = bool(git('status', '--porcelain', '--untracked-files=no'))
  return record


# What a full disk, a quota or a file-size limit (ulimit -f) raise: OSError's errno, or
# TensorFlow's writers' message (TensorBoard's events file).
_NO_SPACE_ERRNOS = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)
_NO_SPACE_MESSAGES = ('No space left on device', 'File too large', 'Disk quota exceeded')


def out_of_space(error: BaseException | None, output_dir: str | os.PathLike) -> str:
  """One line saying that `error` (or an error it was raised from) is a write that found
  no room for `output_dir`, with the free space there; '' for any other error."""
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    if (isinstance(error, OSError) and error.errno in _NO_SPACE_ERRNOS) or any(
      m in str(error) for m in _NO_SPACE_MESSAGES
    ):
      cause = next(
        (m for m in _NO_SPACE_MESSAGES if m in str(error)),
        os.strerror(error.errno)
        if isinstance(error, OSError) and error.errno
        else type(error).__name__,
      )
      existing = next(
        (
          p
          for p in (
            pathlib.Path(output_dir).absolute(),
            *pathlib.Path(output_dir).absolute().parents,
          )
          if p.exists()
        ),
        pathlib.Path('/'),
      )
      usage = shutil.disk_usage(existing)
      return (
        f'cannot write to {output_dir} ({cause}; {usage.free / 2**20:,.0f} MB free on'
        ' its file system, or a file-size limit: ulimit -f): the rows and'
        ' checkpoints written before are intact; make room and continue with'
        ' --resume.'
      )
    error = error.__cause__ or error.__context__
  return ''
