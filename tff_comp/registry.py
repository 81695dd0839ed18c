"""Named algorithms, tasks, runtimes and aggregator blocks, with third-party plugins
through entry points.

Built-ins register with a decorator on their builder:

    @registry.register_algorithm('fedprox')
    def fedprox(model, *, client_learning_rate: float, mu: float = 0.01) -> Algorithm: ...

An algorithm's builder returns the runtime-free `ops.algorithm.Algorithm`, which every
registered runtime (`register_runtime`: 'tff', 'inprocess', 'ray') can run; a plugin's builder
may instead return a TFF LearningProcess, which runs on TFF's runtime.

Another package adds its own by declaring entry points in its packaging metadata, in
the groups `tff_comp.algorithms`, `tff_comp.tasks`, `tff_comp.runtimes`,
`tff_comp.combiners` (what `--aggregator` chooses beyond the mean and DP),
`tff_comp.pre_aggregations` (`--pre_aggregation`: rows mixed before a robust combiner),
`tff_comp.attacks` (`--attack`: simulated Byzantine clients), `tff_comp.compressors`
(`--compression`) and `tff_comp.experiments` (reproduction grids):

    [options.entry_points]
    tff_comp.algorithms =
        my_algo = my_package.my_module:build_my_algo

Loading an entry point imports its module; a builder its module did not register
already is registered under the entry point's name. The keyword-only parameters of a
builder with a plain type (float, int, bool, str) are its hyperparameters: binaries
turn them into flags. A runtime or a combiner declares its settings record instead
(`tff_comp.settings`), whose fields become flags.

This module imports only `settings` of tff_comp, which imports nothing of it, so any
layer may register its blocks (the math layer's combiners included).
"""

from collections.abc import Callable
import dataclasses
import difflib
import importlib
import importlib.metadata
import inspect
import math
import re
import sys
import typing
from typing import Any, TypeVar
import warnings

from tff_comp import settings

# A registered builder, returned unchanged by the decorators (its signature kept for
# type checkers).
Builder = TypeVar('Builder', bound=Callable[..., Any])

ALGORITHMS_GROUP = 'tff_comp.algorithms'
TASKS_GROUP = 'tff_comp.tasks'
MODELS_GROUP = 'tff_comp.models'
RUNTIMES_GROUP = 'tff_comp.runtimes'
COMBINERS_GROUP = 'tff_comp.combiners'
PRE_AGGREGATIONS_GROUP = 'tff_comp.pre_aggregations'
ATTACKS_GROUP = 'tff_comp.attacks'
COMPRESSORS_GROUP = 'tff_comp.compressors'
MECHANISMS_GROUP = 'tff_comp.mechanisms'
EXPERIMENTS_GROUP = 'tff_comp.experiments'
_FLAG_TYPES = (float, int, bool, str)


class RegistryError(KeyError):
  """An unknown or duplicate name; the message lists what is known."""

  def __str__(self) -> str:
    return str(self.args[0])


def _signature(builder: Callable) -> inspect.Signature:
  """The builder's signature with its annotations evaluated (a module using
  `from __future__ import annotations` has them as strings); unresolvable annotations
  stay strings, so such a parameter is not a hyperparameter."""
  try:
    return inspect.signature(builder, eval_str=True)
  except (NameError, SyntaxError, TypeError):
    return inspect.signature(builder)


def arg_docs(docstring: str | None) -> dict[str, str]:
  """{name: text} of a Google-style docstring's `Args:` section (continuation lines
  joined). inspect and pydoc offer no parser for it; this reads just that section."""
  docs: dict[str, str] = {}
  lines = inspect.cleandoc(docstring or '').splitlines()
  if 'Args:' not in (line.strip() for line in lines):
    return docs
  start = [line.strip() for line in lines].index('Args:') + 1
  name, indent = None, None
  for line in lines[start:]:
    if not line.strip() or not line.startswith(' '):
      break  # the section ends at a blank line or the next section's header
    depth = len(line) - len(line.lstrip())
    indent = depth if indent is None else indent
    entry = re.match(r'(\w+)(?: \([^)]*\))?: (.*)', line.strip())
    if depth == indent and entry:
      name = entry[1]
      docs[name] = entry[2]
    elif name is not None:
      docs[name] += ' ' + line.strip()
  return docs


@dataclasses.dataclass(frozen=True)
class Hparam:
  """A builder's keyword-only parameter with a flag-friendly type."""

  name: str
  type: type
  default: Any  # inspect.Parameter.empty when required
  choices: tuple[Any, ...] = ()  # the allowed values of a `Literal[...]` parameter

  def typed(self, value: Any) -> Any:
    """`value` as this parameter takes it (`settings.typed`: Python's bool, int, float
    or str; a NumPy scalar as Python's, an integer for a float as a float), a finite
    float, one of `choices` when it has them.

    Raises:
      ValueError: (one line, without the parameter's name) another type, a bool for a
        number, a float that is not finite, or a value outside `choices`.
    """
    value = settings.typed(self.type, value)
    if isinstance(value, float) and not math.isfinite(value):
      raise ValueError(f'must be a finite number, got {value}.')
    if self.choices and value not in self.choices:
      raise ValueError(f'takes one of {", ".join(map(str, self.choices))}; got {value!r}.')
    return value


@dataclasses.dataclass(frozen=True)
class Entry:
  """A registered builder, with arguments the registration fixes (a variant).

  An algorithm may name its `home_task` (run when no task is given) and
  `home_settings`: run settings and options that work for that (algorithm, task) pair,
  applied over the task's defaults when the task is the home task.
  `divergence_hint` names the algorithm's likely cause of a diverged run.
  A runtime or an aggregation block (a combiner, pre-aggregation, attack, compressor) may
  declare its settings record (`options`, a `tff_comp.settings` record whose fields
  become flags and config.json entries); a
  runtime its place in 'auto''s order (`auto_rank`, lowest first; None: only when
  named), a cheap `why_not(program, options)` returning why it cannot run a program (''
  when it can), and the `label` the run's header calls it by.
  """

  name: str
  builder: Callable[..., Any]
  fixed: tuple[tuple[str, Any], ...] = ()
  home_task: str | None = None
  home_settings: tuple[tuple[str, Any], ...] = ()
  divergence_hint: str = 'try a smaller --client_learning_rate'
  options: type | None = None
  auto_rank: int | None = None
  why_not: Callable[[Any, Any], str] | None = None
  label: str = ''

  @property
  def hparams(self) -> tuple[Hparam, ...]:
    """Keyword-only parameters with a plain type, in declaration order, not fixed."""
    signature = _signature(self.builder)
    fixed = dict(self.fixed)
    found = []
    for p in signature.parameters.values():
      if p.kind is not inspect.Parameter.KEYWORD_ONLY or p.name in fixed:
        continue
      if p.annotation in _FLAG_TYPES:
        found.append(Hparam(p.name, p.annotation, p.default))
      elif typing.get_origin(p.annotation) is typing.Literal:
        choices = typing.get_args(p.annotation)
        found.append(Hparam(p.name, type(choices[0]), p.default, choices))
    return tuple(found)

  def option_help(self, name: str) -> str:
    """What option `name` does, from the builder docstring's `Args:` ('' if absent)."""
    return arg_docs(self.builder.__doc__).get(name, '')

  @property
  def summary(self) -> str:
    """One line: the first sentence of the module docstring of the module's own builder
    (`build_<module>` or `build_<module>_task`), else of the builder's docstring, and the
    fixed arguments of a variant."""
    base = self.builder.__module__.rsplit('.', 1)[-1]
    module = sys.modules.get(self.builder.__module__)
    own = self.builder.__name__ in (base, f'build_{base}', f'build_{base}_task')
    doc = (module.__doc__ if own and module is not None else None) or self.builder.__doc__
    paragraph = ' '.join((doc or '').strip().split('\n\n')[0].split())
    sentence = _FULL_STOP.split(paragraph, maxsplit=1)[0].rstrip('.:,') + '.' if paragraph else ''
    fixed = ', '.join(f'{k}={v!r}' for k, v in self.fixed)
    return sentence + (f' [{fixed}]' if fixed else '')

  def accepts(self, name: str) -> bool:
    return name in _signature(self.builder).parameters and name not in dict(self.fixed)

  def build(self, *args, **kwargs) -> Any:
    """Calls the builder with the fixed arguments added: for an algorithm, its
    `ops.algorithm.Algorithm` (a plugin's builder may return a TFF LearningProcess)."""
    return self.builder(*args, **kwargs, **dict(self.fixed))

  def process(self, *args, **kwargs) -> Any:
    """An algorithm's TFF LearningProcess: `build`'s Algorithm composed
    (`composer.compose`), or the process a plugin's builder returns."""
    from tff_comp.learning_process import composer  # imports TFF
    from tff_comp.ops import algorithm as algorithm_lib

    built = self.build(*args, **kwargs)
    return composer.compose(built) if isinstance(built, algorithm_lib.Algorithm) else built


# A full stop ending a sentence: not an abbreviation's ("Reddi et al. 2021", "e.g."),
# and followed by what starts a sentence.
_FULL_STOP = re.compile(r'(?<!\bet al)(?<!\be\.g)(?<!\bi\.e)(?<!\bvs)\.\s+(?=[A-Z`(\'"])')


class Registry:
  """A name -> builder table for one kind of plugin."""

  def __init__(self, kind: str, group: str, builtin_package: str | None = None):
    self.kind = kind
    self.group = group
    self._builtin_package = builtin_package
    self._entries: dict[str, Entry] = {}
    self._plugins_loaded = False

  def register(
    self, name: str, *, metadata: dict[str, Any] | None = None, **fixed: Any
  ) -> Callable[[Builder], Builder]:
    """Decorator registering a builder under `name`; a name is registered once.

    Keyword arguments are fixed for this name: stacking
    `@register('fedmid')` and `@register('fedmid_osp', client_prox=False)` registers
    one builder as an algorithm and its ablation. `metadata`: the Entry's other fields
    (home_task, home_settings, divergence_hint).
    """

    def decorator(builder: Builder) -> Builder:
      self.add(name, builder, metadata=metadata, **fixed)
      return builder

    return decorator

  def add(
    self, name: str, builder: Callable, *, metadata: dict[str, Any] | None = None, **fixed: Any
  ) -> None:
    if name in self._entries:
      existing = self._entries[name].builder
      raise RegistryError(
        f'{self.kind} {name!r} is already registered (by'
        f' {existing.__module__}.{existing.__qualname__}).'
      )
    metadata = dict(metadata or {})
    if 'home_settings' in metadata:
      metadata['home_settings'] = tuple(sorted(metadata['home_settings'].items()))
    self._entries[name] = Entry(name, builder, tuple(sorted(fixed.items())), **metadata)

  def load_plugins(self) -> None:
    """Imports the built-in package and the entry points of `self.group` (once)."""
    if self._plugins_loaded:
      return
    self._plugins_loaded = True
    if self._builtin_package is not None:
      importlib.import_module(self._builtin_package)
    for ep in importlib.metadata.entry_points(group=self.group):
      obj = ep.load()
      registered = any(e.builder is obj for e in self._entries.values())
      if not callable(obj) or registered:
        continue
      if ep.name in self._entries:
        existing = self._entries[ep.name].builder
        warnings.warn(
          f'plugin {ep.value} registers {self.kind} {ep.name!r}, already'
          f' registered by {existing.__module__}.{existing.__qualname__};'
          ' keeping the first.',
          stacklevel=1,
        )
        continue
      self.add(ep.name, obj)

  def names(self) -> list[str]:
    self.load_plugins()
    return sorted(self._entries)

  def get(self, name: str) -> Entry:
    """The entry for `name`; an unknown name raises a RegistryError listing names."""
    names = self.names()
    if name not in self._entries:
      close = difflib.get_close_matches(name.lower(), names, n=1)
      hint = f' Did you mean {close[0]!r}?' if close else ''
      raise RegistryError(
        f'unknown {self.kind} {name!r}.{hint} Known {self.kind}s: {", ".join(names)}.'
      )
    return self._entries[name]

  def name_of(self, builder: Callable) -> str:
    """The name `builder` is registered under (its first, for a builder with variants)."""
    self.load_plugins()
    for entry in self._entries.values():
      if entry.builder is builder:
        return entry.name
    raise RegistryError(f'{builder.__qualname__} is not a registered {self.kind}.')


# Models a task may take in place of its own (`--emnist_model=<name>`): an entry's builder
# is `(input_shape, num_classes, seed) -> tf.keras.Model` returning logits.
MODELS = Registry('model', MODELS_GROUP)
ALGORITHMS = Registry('algorithm', ALGORITHMS_GROUP, 'tff_comp.algorithms')
TASKS = Registry('task', TASKS_GROUP, 'tff_comp.tasks')
RUNTIMES = Registry('runtime', RUNTIMES_GROUP, 'tff_comp.runtime')
# What `--aggregator` chooses beyond the mean and DP: combiners of a cohort's rows (the
# Byzantine-robust ones), each with its settings record (`register_combiner`).
COMBINERS = Registry('combiner', COMBINERS_GROUP, 'tff_comp.ops.aggregators')
# What `--pre_aggregation` chooses: rows mixed before a robust combiner reads them.
PRE_AGGREGATIONS = Registry('pre-aggregation', PRE_AGGREGATIONS_GROUP, 'tff_comp.ops.aggregators')
# What `--attack` chooses: simulated Byzantine clients, a chain's first stage.
ATTACKS = Registry('attack', ATTACKS_GROUP, 'tff_comp.ops.aggregators')
# What `--compression` chooses: what a client sends in fewer bits.
COMPRESSORS = Registry('compressor', COMPRESSORS_GROUP, 'tff_comp.ops.aggregators')
# What `--aggregator` chooses among clipping and DP: an `ops.privacy.PrivateMean`
# subclass, built from the privacy settings' fields it declares.
MECHANISMS = Registry('privacy mechanism', MECHANISMS_GROUP, 'tff_comp.ops.privacy')
# Reproduction grids (`tff_comp.binaries.reproductions.Reproduction`); an entry's builder takes
# no argument and returns the grid. The binaries register the built-in grids when they
# import them (the library does not depend on its binaries).
REPRODUCTIONS = Registry('reproduction', EXPERIMENTS_GROUP)


GROUPS = (
  ALGORITHMS_GROUP,
  TASKS_GROUP,
  RUNTIMES_GROUP,
  COMBINERS_GROUP,
  PRE_AGGREGATIONS_GROUP,
  ATTACKS_GROUP,
  COMPRESSORS_GROUP,
  MECHANISMS_GROUP,
  EXPERIMENTS_GROUP,
  MODELS_GROUP,
)


def plugin_versions() -> dict[str, str]:
  """{distribution: version} of the installed packages registering plugins (entry points
  in tff_comp's groups): what a run used besides tff_comp itself, for its record."""
  found = {}
  for group in GROUPS:
    for ep in importlib.metadata.entry_points(group=group):
      if ep.dist is not None:
        found[ep.dist.name] = ep.dist.version
  return dict(sorted(found.items()))


def register_algorithm(
  name: str,
  *,
  home_task: str | None = None,
  home_settings: dict[str, Any] | None = None,
  divergence_hint: str | None = None,
  **fixed: Any,
) -> Callable[[Builder], Builder]:
  """Registers an algorithm builder `(model, *, hyperparameters) -> Algorithm` (the
  runtime-free `ops.algorithm.Algorithm`; a plugin may return a TFF LearningProcess,
  which then runs on TFF's runtime only);
  `fixed` keyword arguments make a named variant (see `Registry.register`); the others
  are `Entry` fields."""
  metadata = dict(home_task=home_task, home_settings=home_settings or {})
  if divergence_hint:
    metadata['divergence_hint'] = divergence_hint
  return ALGORITHMS.register(name, metadata=metadata, **fixed)


def register_task(name: str) -> Callable[[Builder], Builder]:
  """Registers a task builder `(*, options) -> tff_comp.task.Task`."""
  return TASKS.register(name)


def register_model(name: str) -> Callable[[Builder], Builder]:
  """Registers a model builder `(input_shape, num_classes, seed) -> tf.keras.Model`
  (built, returning logits) that the image classification tasks take by name
  (`--emnist_model=name`, `--cifar100_model=name`)."""
  return MODELS.register(name)


def register_runtime(
  name: str,
  *,
  options: type | None = None,
  auto_rank: int | None = None,
  why_not: Callable[[Any, Any], str] | None = None,
  label: str = '',
):
  """Registers a runtime builder `(program, client_data, options, facts) -> Runtime`
  (`tff_comp.runtime.base`: `Runtime`, `RunFacts`); `program` is an Algorithm or a
  LearningProcess, `options` an instance of the runtime's own settings record `options`
  (None without one). `auto_rank`: its place in 'auto''s order (None: only when named);
  `why_not(program, options)`: why it cannot run `program` ('' when it can), asked
  before building (the builder may still raise `runtime.base.UnsupportedError`);
  `label`: its name in the run's header (default `name`)."""
  return RUNTIMES.register(
    name, metadata=dict(options=options, auto_rank=auto_rank, why_not=why_not, label=label or name)
  )


def register_combiner(name: str, *, options: type | None = None):
  """Registers a combiner builder `(options, rows) -> ops.aggregators.Combiner` that
  `--aggregator=name` chooses; `rows`: those it reads a round (--clients_per_round, or
  what a pre-aggregation makes of them). `options`: its settings record (a frozen
  dataclass of `tff_comp.settings.setting` fields; None: it has none), whose fields
  become flags of the run's aggregation record (`aggregation_settings.AggregationOptions`)
  applying with `--aggregator=name` (a field several combiners declare, alike, applies
  with each); `options` is an instance of it. The settings refuse rows below the
  combiner's `min_rows`; the builder raises ValueError, one line naming the flags, for
  other settings it cannot take. The first sentence of its docstring is its line in
  `--aggregator`'s help."""
  return COMBINERS.register(name, metadata=dict(options=options))


def register_pre_aggregation(name: str, *, options: type | None = None):
  """Registers a pre-aggregation builder `(options, clients_per_round) ->
  ops.aggregators.PreAggregation` that `--pre_aggregation=name` chooses (rows mixed
  before a robust combiner reads them); `options` as `register_combiner`'s, its fields
  applying with `--pre_aggregation=name`."""
  return PRE_AGGREGATIONS.register(name, metadata=dict(options=options))


def register_attack(name: str, *, options: type | None = None):
  """Registers an attack builder `(options, clients_per_round) -> ops.aggregators.Stage`
  (an `ops.aggregators.attacks.Attack`; None for an attack on the data) that
  `--attack=name` chooses; `options` as `register_combiner`'s, its fields applying with
  `--attack=name`."""
  return ATTACKS.register(name, metadata=dict(options=options))


def register_mechanism(name: str):
  """Registers a clipping or DP mechanism, an `ops.privacy.PrivateMean` subclass, that
  `--aggregator=name` chooses; the run builds it from the privacy settings named as its
  fields (`privacy_settings.PrivacyOptions`) and reads what it is from its class
  attributes (`private`, `cohort_scaled`, `adaptive`, `correlated`)."""
  return MECHANISMS.register(name)


def register_compressor(name: str, *, options: type | None = None):
  """Registers a compressor builder `(options, clients_per_round) -> tuple of
  ops.aggregators.Stage` (the compressor last, after any stage it needs first, as a
  rotation) that `--compression=name` chooses; `options` as `register_combiner`'s, its
  fields applying with `--compression=name`. `--error_feedback` wraps the last stage
  (`Stage.for_error_feedback`), which must be contractive."""
  return COMPRESSORS.register(name, metadata=dict(options=options))


def register_reproduction(name: str, reproduction: Any) -> None:
  """Registers a reproduction grid (`tff_comp.binaries.reproductions.Reproduction`) under
  `name`, so `reproduce.py --experiment=name` sweeps it (a plugin's own algorithms
  included). An entry point in the group `tff_comp.experiments` names a function
  returning one."""
  REPRODUCTIONS.add(name, lambda: reproduction)


def get_runtime(name: str) -> Entry:
  return RUNTIMES.get(name)


def get_algorithm(name: str) -> Entry:
  return ALGORITHMS.get(name)


def get_task(name: str) -> Entry:
  return TASKS.get(name)
