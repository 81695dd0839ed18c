"""TFF's published federated datasets, read offline from their SQLite files.

`tff.simulation.datasets.<name>.load_data(cache_dir=...)` downloads
`<name>.sqlite.lzma` into `cache_dir` (default ~/.tff) when the SQLite file is not there,
and otherwise reads it. `load` calls it only after `locate` has found the file, so a run
never opens the network: a missing file is one line naming the path and where the file
comes from. Tests write small files in the same format
(`tff.simulation.datasets.save_to_sql_client_data`).
"""

from collections.abc import Callable
import contextlib
import dataclasses
import os
import pathlib
import sqlite3
from typing import Any

import tensorflow_federated as tff

from tff_comp import paths

_URL = 'https://storage.googleapis.com/tff-datasets-public/{}.lzma'


@dataclasses.dataclass(frozen=True)
class Source:
  """One of TFF's datasets: the SQLite file its loader reads, the loader, and the
  splits it reads (their `split_name`s in the file), by the loader's options."""

  filename: str
  load: Callable[..., Any]  # (cache_dir, **options) -> TFF's load_data result
  splits: Callable[..., tuple[str, ...]] = lambda: ('train', 'test')


SOURCES = {
  'emnist': Source(
    'emnist_all.sqlite',
    lambda d, only_digits=False: tff.simulation.datasets.emnist.load_data(only_digits, cache_dir=d),
    lambda only_digits=False: (
      ('digits_only_train', 'digits_only_test') if only_digits else ('all_train', 'all_test')
    ),
  ),
  'shakespeare': Source(
    'shakespeare.sqlite', lambda d: tff.simulation.datasets.shakespeare.load_data(cache_dir=d)
  ),
  'cifar100': Source(
    'cifar100.sqlite', lambda d: tff.simulation.datasets.cifar100.load_data(cache_dir=d)
  ),
  'stackoverflow': Source(
    'stackoverflow.sqlite',
    lambda d: tff.simulation.datasets.stackoverflow.load_data(cache_dir=d),
    lambda: ('train', 'heldout', 'test'),
  ),
}


def default_dir() -> str:
  """Where TFF's loaders cache their files (`download.get_compressed_file`)."""
  return os.path.join(os.path.expanduser('~'), '.tff')


def locate(name: str, data_dir: str = '', hint: str = '') -> pathlib.Path:
  """The path of dataset `name`'s SQLite file in `data_dir` (default `default_dir()`).

  Raises:
    ValueError: (one line) the file is not there: where to get it, then `hint` (default:
      the `--<name>_data_dir` and `--<name>_source=synthetic` flags).
  """
  source = SOURCES[name]
  path = pathlib.Path(data_dir or default_dir()) / source.filename
  if not path.is_file():
    hint = hint or (f'point --{name}_data_dir at its folder, or run --{name}_source=synthetic')
    raise ValueError(
      f"{path} not found: this run reads TFF's {name} file offline. Fetch"
      f' {_URL.format(source.filename)} and unpack it there (unxz), copy a ~/.tff cache'
      f' holding it, or {hint}.'
    )
  return path


def load(name: str, data_dir: str = '', hint: str = '', **options) -> Any:
  """TFF's `load_data` for dataset `name`, reading the file `locate` found (no
  download).

  Raises:
    ValueError: (one line) the file is not a TFF SQLite file, or lacks a split TFF's
      loader reads (a file written by `save_to_sql_client_data` without its
      `split_names_by_client_id`: TFF's loader fails with a StopIteration).
  """
  path = locate(name, data_dir, hint)
  source = SOURCES[name]
  wanted = source.splits(**options)
  try:
    with contextlib.closing(sqlite3.connect(f'file:{path}?mode=ro', uri=True)) as db:
      held = sorted(row[0] for row in db.execute('SELECT DISTINCT split_name FROM client_metadata'))
  except sqlite3.Error as e:
    raise ValueError(f'{path} is not a TFF SQLite file of client data ({e}).') from e
  missing = [split for split in wanted if split not in held]
  if missing:
    raise ValueError(
      f"{path} holds the splits {held} but TFF's {name} loader reads {list(wanted)}"
      f" ({', '.join(missing)} missing): write it with save_to_sql_client_data's"
      ' split_names_by_client_id naming those splits.'
    )
  paths.note_data_file(path)
  return source.load(str(path.parent), **options)


def first_clients(
  data: tff.simulation.datasets.ClientData, count: int
) -> tff.simulation.datasets.ClientData:
  """`data` restricted to its first `count` client ids in sorted order (0: all)."""
  if not count:
    return data
  return data.from_clients_and_tf_fn(sorted(data.client_ids)[:count], data.serializable_dataset_fn)
