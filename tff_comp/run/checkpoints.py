"""A run's checkpoints: `state_<round>.npz` files written in the background, the
newest kept, a damaged one set aside."""

from collections.abc import Iterable, Iterator, Mapping, Sequence
import concurrent.futures
import dataclasses
import json
import os
import pathlib
import shutil
import time
from typing import Any

from absl import logging
import numpy as np
import tensorflow as tf

from tff_comp import settings


class OtherLayout(ValueError):
  """A readable checkpoint of a state laid out otherwise than this run's (saved by
  another version of tff_comp, or for another algorithm): not damage, not resumable."""


def layout(state: Any) -> Iterator[str]:
  """The paths of `state`'s leaves ('finalizer/dual/0'), in `tf.nest.flatten`'s order.
  tf.nest has no public path flattening; this walks the containers a state holds
  (NamedTuples by field, mappings by sorted key, sequences by index)."""

  def walk(tree: Any, path: str) -> Iterator[str]:
    items: Iterable[tuple[str, Any]]
    if isinstance(tree, Mapping):
      items = ((str(k), tree[k]) for k in sorted(tree))
    elif hasattr(tree, '_fields'):
      items = zip(tree._fields, tree)
    elif isinstance(tree, (list, tuple)):
      items = ((str(i), v) for i, v in enumerate(tree))
    else:
      yield path
      return
    for name, value in items:
      yield from walk(value, f'{path}/{name}' if path else name)

  return walk(state, '')


class Checkpoints:
  """The run's state every few rounds, in `output_dir/checkpoints`: round r's state as
  `state_<r>.npz`, its leaves in `tf.nest.flatten` order beside their paths (`layout`),
  the round it was saved at and that round's training metrics as metrics.csv holds
  them (`round`, `row`), restored into the structure of a fresh `initialize()`; the
  newest `keep_checkpoints` are kept. A file whose own round is not its name's, or whose metrics are
  not metrics.csv's row of that round (a checkpoint copied over another, or from
  another run), is set aside as a damaged one is.

  Why not TFF's `tff.program.FileProgramStateManager` (used before 0.3.0): it writes a
  SavedModel, tens of times an .npz's cost a save on lasso (more than a round at the
  default interval of 50 rounds), and CPU work a background thread does not hide on two
  cores. Each file is written to a temporary name, synced and renamed, so
  a kill never leaves a half-written checkpoint under a checkpoint's name; temporary
  files a killed run left are removed when the next run opens the directory. `save`
  writes in the background and returns at once; the next call waits for it, as do
  `wait` and `close` (raising what a save raised, e.g. a full disk).
  """

  def __init__(self, output_dir: pathlib.Path, options: 'CheckpointOptions | None' = None):
    self.options = options or CheckpointOptions()
    self._root, self._damaged = output_dir / 'checkpoints', output_dir / 'checkpoints_damaged'
    self._root.mkdir(parents=True, exist_ok=True)
    for stale in self._root.glob('.state_*'):  # a killed save's temporary file
      stale.unlink(missing_ok=True)
    self._thread = concurrent.futures.ThreadPoolExecutor(1, 'checkpoints')
    self._saving: concurrent.futures.Future | None = None

  def wait(self) -> None:
    """Waits for the save under way, if any (re-raising its error)."""
    saving, self._saving = self._saving, None
    if saving is not None:
      saving.result()

  def close(self) -> None:
    try:
      self.wait()
    finally:
      self._thread.shutdown()

  def rounds(self) -> list[int]:
    """The rounds saved, oldest first."""
    self.wait()
    return self._on_disk()

  def _on_disk(self) -> list[int]:
    found = (_round_of(path) for path in self._root.glob('state_*.npz'))
    return sorted(r for r in found if r is not None)

  def clear(self) -> None:
    """Removes every checkpoint (a fresh run), those of earlier versions' format too."""
    self.wait()
    shutil.rmtree(self._root)
    self._root.mkdir(parents=True)

  def save(self, state, round_num: int, row: Mapping[str, Any] | None = None) -> None:
    """Starts saving `state` as round `round_num`'s checkpoint; `row`: that round's
    metrics (those of them metrics.csv holds are compared when it is loaded)."""
    self.wait()
    leaves = {f'leaf_{i}': np.asarray(leaf) for i, leaf in enumerate(tf.nest.flatten(state))}
    leaves['layout'] = np.array(list(layout(state)), dtype=str)
    leaves['round'] = np.array(round_num, np.int64)
    leaves['row'] = np.array(json.dumps(_comparable(row or {}), sort_keys=True))
    self._saving = self._thread.submit(self._write, leaves, round_num)

  def _write(self, leaves: dict[str, np.ndarray], round_num: int) -> None:
    path = self._root / f'state_{round_num}.npz'
    temporary = self._root / f'.state_{round_num}.{os.getpid()}.npz'
    with open(temporary, 'wb') as f:
      np.savez(f, **leaves)
      f.flush()
      os.fsync(f.fileno())
    os.replace(temporary, path)
    for old in self._on_disk()[: -self.options.keep_checkpoints]:
      (self._root / f'state_{old}.npz').unlink(missing_ok=True)

  def load_latest(
    self, template, up_to: int | None = None, rows: Sequence[Mapping[str, str]] = ()
  ) -> tuple[Any, int]:
    """(state, round) of the newest readable checkpoint (of a round <= `up_to`, if
    given; later ones are left alone), or (None, 0). A damaged one (cut short, garbled,
    of another structure than `template`, of another round than its name, or whose
    metrics differ from `rows[round]`, metrics.csv's row of its round, where given) is
    moved to `checkpoints_damaged/` under a name of its own, so the run saves that round
    afresh when it gets there, and the one before it is tried.

    Raises:
      OtherLayout: a readable checkpoint whose leaves are not `template`'s (another
        version's or algorithm's state): none is resumed, none set aside.
    """
    expected = [np.asarray(leaf) for leaf in tf.nest.flatten(template)]
    paths = list(layout(template))
    for round_num in reversed(self.rounds()):
      if up_to is not None and round_num > up_to:
        continue
      path = self._root / f'state_{round_num}.npz'
      try:
        with np.load(path, allow_pickle=False) as saved:
          if 'layout' not in saved.files:
            raise OtherLayout(
              f'{path} was saved by an earlier version of tff_comp (without its layout)'
            )
          saved_paths = list(saved['layout'])
          if saved_paths != paths:
            first = next(
              (f'saved {a!r}, this run has {b!r}' for a, b in zip(saved_paths, paths) if a != b),
              f'{len(saved_paths)} values saved, this run has {len(paths)}',
            )
            raise OtherLayout(
              f'{path} holds another layout of the state ({first}):'
              ' saved by another version of tff_comp or for another'
              ' algorithm'
            )
          if 'round' in saved.files:  # saved by 0.4 or later
            _check_round(saved, round_num, rows)
          leaf_files = [name for name in saved.files if name.startswith('leaf_')]
          if len(leaf_files) != len(expected):
            raise ValueError(f'{len(leaf_files)} values, expected {len(expected)}')
          leaves = [saved[f'leaf_{i}'] for i in range(len(expected))]
        # Shapes must match; dtypes are those saved, the running state's (a fresh
        # state may hold a Python float where rounds hold float32).
        for i, (leaf, like) in enumerate(zip(leaves, expected)):
          if leaf.shape != like.shape:
            raise ValueError(f'value {i} has shape {list(leaf.shape)}, expected {list(like.shape)}')
        return tf.nest.pack_sequence_as(template, leaves), round_num
      except OtherLayout:
        raise
      except Exception as error:  # any damage: set aside
        self._set_aside(path, error)
    return None, 0

  def _set_aside(self, path: pathlib.Path, error: Exception) -> None:
    self._damaged.mkdir(parents=True, exist_ok=True)
    aside = self._damaged / f'{path.stem}.{time.time_ns()}.npz'  # never over an earlier one
    os.replace(path, aside)
    logging.warning(
      'checkpoint of round %d is damaged (%s: %s); moved to %s.',
      _round_of(path),
      type(error).__name__,
      error,
      aside,
    )


def _comparable(row: Mapping[str, Any]) -> dict[str, str]:
  """A round's training metrics as metrics.csv writes them (`str` of each value), those
  a checkpoint is compared on: what the round's state computed."""
  return {k: str(v) for k, v in row.items() if k.startswith('train/')}


def _check_round(saved: Any, round_num: int, rows: Sequence[Mapping[str, str]]) -> None:
  """ValueError unless the checkpoint `saved` (an open .npz) holds the state of round
  `round_num`, as its name says, with metrics.csv's metrics of that round."""
  own = int(saved['round'])
  if own != round_num:
    raise ValueError(f'it holds the state of round {own}, not of round {round_num}')
  if round_num < len(rows):
    kept = json.loads(str(saved['row']))
    written = {k: rows[round_num].get(k) for k in kept}
    if kept != written:
      name = next(k for k in kept if kept[k] != written[k])
      raise ValueError(
        f"its round's {name} was {kept[name]}; metrics.csv has"
        f" {written[name]!r} (another run's checkpoint?)"
      )


@dataclasses.dataclass(frozen=True)
class CheckpointOptions:
  """How often a run saves its state for `--resume`."""

  checkpoint_every: int = settings.setting(
    50,
    'Save the process state every this many rounds (and at the last), for --resume.',
    lower=1,
    upper=settings.MAX_COUNT,
    resumable=True,
    per_trial=True,
  )
  keep_checkpoints: int = settings.setting(
    2,
    'How many of the newest checkpoints a run keeps (older ones are deleted as new'
    ' ones are saved); more keep earlier states to study or resume from.',
    lower=1,
    upper=settings.MAX_COUNT,
    resumable=True,
    per_trial=True,
  )

  def __post_init__(self):
    settings.check(self)


def _round_of(path: pathlib.Path) -> int | None:
  """The round of a checkpoint file `state_<round>.npz` (None: not one)."""
  number = path.name[len('state_') : -len('.npz')]
  return int(number) if number.isdigit() else None
