"""Combiners and pre-aggregations as plugins: `--aggregator`'s choices and help, each
combiner's flags and the settings they apply with, and the chain built, all derived from
what is registered (`registry.register_combiner`); a combiner from a plugin package
reaches run.py."""

import dataclasses
import json
import os
import pathlib

import pytest

from tests import cli_driver
from tff_comp import registry, settings, trial_groups
from tff_comp.config import aggregation_settings
from tff_comp.ops import aggregators

BUILT_IN = {
  'bulyan',
  'centered_clip',
  'geometric_median',
  'krum',
  'median',
  'multi_krum',
  'trimmed_mean',
}


def _spec(record: type, name: str) -> settings.Spec:
  return next(s for s in settings.specs(record) if s.name == name)


def test_the_aggregator_flag_lists_the_mean_dp_and_every_registered_combiner():
  spec = _spec(aggregation_settings.AggregationOptions, 'aggregator')
  assert BUILT_IN <= set(registry.COMBINERS.names())
  mechanisms = ('clip', 'dp', 'dp_adaptive', 'dp_bandmf', 'dp_ftrl_tree')
  assert spec.choices == ('mean', *mechanisms, *registry.COMBINERS.names())
  for name in registry.COMBINERS.names():  # each with its line and its flags
    entry = registry.COMBINERS.get(name)
    flags = [f'--{f.name}' for f in dataclasses.fields(entry.options or _NoOptions)]
    assert f'{name}: ' in spec.help and all(flag in spec.help for flag in flags), name


@dataclasses.dataclass
class _NoOptions:
  pass


def test_a_combiners_settings_apply_with_the_combiners_declaring_them():
  record = aggregation_settings.AggregationOptions
  assert _spec(record, 'byzantine_clients').applies_when == {
    'aggregator': ('bulyan', 'krum', 'multi_krum'),
    'pre_aggregation': ('nnm',),
  }
  assert _spec(record, 'trim_fraction').applies_when == {'aggregator': ('trimmed_mean',)}
  assert _spec(record, 'trim_fraction').help.startswith('--aggregator=trimmed_mean: ')
  # Declared once, on the block: the settings its state holds start each trial's chain.
  assert {'aggregation.byzantine_clients', 'aggregation.trim_fraction'} <= set(
    trial_groups.CHAIN_START
  )
  assert 'aggregation.geometric_median_iters' not in trial_groups.CHAIN_START


def test_the_chain_is_built_by_the_registered_builder_with_its_options():
  options = aggregation_settings.AggregationOptions(
    aggregator='multi_krum', byzantine_clients=2, multi_krum_select=3
  )
  combiner = options.chain(None, 10).combiner
  assert isinstance(combiner, aggregators.Krum)
  assert (combiner.byzantine, combiner.select) == (2, 3)
  says = r'--aggregator=bulyan needs at least 11 rows a round \(4 f \+ 3 with f = 2\)'
  with pytest.raises(ValueError, match=says):
    dataclasses.replace(options, aggregator='bulyan').chain(None, 10)


def test_a_setting_declared_unlike_by_two_combiners_is_refused(monkeypatch):
  @dataclasses.dataclass(frozen=True)
  class Unlike:
    byzantine_clients: int = settings.setting(2, 'another f.')

  combiners = registry.Registry('combiner', 'no.such.group')
  for name in registry.COMBINERS.names():
    entry = registry.COMBINERS.get(name)
    combiners.add(name, entry.builder, metadata=dict(options=entry.options))
  combiners.add('unlike', lambda options, m: aggregators.Median(), metadata=dict(options=Unlike))
  monkeypatch.setattr(registry, 'COMBINERS', combiners)
  with pytest.raises(
    registry.RegistryError, match=r"combiner 'unlike' declares --byzantine_clients unlike"
  ):
    aggregation_settings._block_fields()


PLUGIN = '''
import dataclasses

from tff_comp import registry, settings
from tff_comp.ops import aggregators


@dataclasses.dataclass(frozen=True)
class Options:
  plugin_trim: float = settings.setting(
    0.1, "the fraction trimmed at each end.", lower=0.0, upper=0.49, per_trial=True
  )


@registry.register_combiner('plugin_trimmed', options=Options)
def build(options: Options, rows: int) -> aggregators.TrimmedMean:
  """A trimmed mean from a plugin package."""
  return aggregators.TrimmedMean(options.plugin_trim)
'''


MECHANISM = '''"""A clipping mechanism from a plugin package."""

import dataclasses

from tff_comp import registry
from tff_comp.ops import aggregators, privacy


@registry.register_mechanism('plugin_clip')
@dataclasses.dataclass(frozen=True)
class PluginClip(privacy.PrivateMean):
  """Each update clipped to --clip_norm, then the weighted mean (a plugin's)."""

  def chain(self) -> aggregators.Chain:
    return aggregators.Chain((aggregators.Clip(self.clip_norm),), aggregators.Mean())
'''


def _install(site: pathlib.Path, package: str, code: str, entry_points: str) -> None:
  """`package` (its `__init__.py` is `code`) and its dist-info in the folder `site`, as
  pip would install it, with `entry_points` (entry_points.txt's text)."""
  (site / package).mkdir(parents=True)
  (site / package / '__init__.py').write_text(code)
  info = site / f'{package}-0.1.dist-info'
  info.mkdir()
  (info / 'METADATA').write_text(f'Metadata-Version: 2.1\nName: {package}\nVersion: 0.1\n')
  (info / 'entry_points.txt').write_text(entry_points)


# name: flags of a one-round `run.py --algo=fedavg --task=lasso` with both plugins installed.
RUNS = {
  'combiner_refused': ('--aggregator=median', '--plugin_trim=0.2'),
  'combiner': ('--aggregator=plugin_trimmed', '--plugin_trim=0.4'),
  'trimmed_0.4': ('--aggregator=trimmed_mean', '--trim_fraction=0.4'),
  'trimmed_default': ('--aggregator=trimmed_mean',),  # 0.1: the option must reach the block
  'mechanism_without_norm': ('--aggregator=plugin_clip',),
  'mechanism_with_noise': ('--aggregator=plugin_clip', '--clip_norm=1', '--noise_multiplier=1'),
  'mechanism': ('--aggregator=plugin_clip', '--clip_norm=0.05'),
  'clip': ('--aggregator=clip', '--clip_norm=0.05'),
  'mean': (),
}


@pytest.fixture(scope='module')
def plugin_runs(repo_root, tmp_path_factory) -> tuple[pathlib.Path, dict[str, list]]:
  """(root, {name: [exit status, stdout, stderr]}): every RUNS command line through
  run.py's parser and main in one interpreter (tests/cli_driver.py) that finds both
  plugin packages on its path, each run writing to root/<name>."""
  root = tmp_path_factory.mktemp('plugins')
  _install(
    root / 'site',
    'mycombiner',
    PLUGIN,
    '[tff_comp.combiners]\nplugin_trimmed = mycombiner:build\n',
  )
  _install(
    root / 'site',
    'mymechanism',
    MECHANISM,
    '[tff_comp.mechanisms]\nplugin_clip = mymechanism:PluginClip\n',
  )
  cases = [
    ['--algo=fedavg', '--task=lasso', '--rounds=1', f'--output_dir={root / name}', *flags]
    for name, flags in RUNS.items()
  ]
  results = cli_driver.run_all(
    cases,
    cwd=repo_root,
    env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3', PYTHONPATH=str(root / 'site')),
  )
  return root, dict(zip(RUNS, results, strict=True))


def _rows(run: pathlib.Path) -> list[str]:
  """metrics.csv's lines without its clock columns."""
  lines = (run / 'metrics.csv').read_text().splitlines()
  header = lines[0].split(',')
  kept = [i for i, name in enumerate(header) if not ('time' in name or 'seconds' in name)]
  return [','.join(line.split(',')[i] for i in kept) for line in lines]


def test_a_combiner_from_a_plugin_package_reaches_the_command_line(plugin_runs):
  """Installed as pip would (a package and its dist-info, entry point group
  tff_comp.combiners), with no edit to tff_comp: its flag is refused out of bounds and
  where it does not apply, and its run equals the built-in trimmed mean's of the same
  fraction (not the default one's)."""
  root, results = plugin_runs
  status, _, stderr = results['combiner_refused']
  assert status != 0
  assert (
    stderr.strip()
    .splitlines()[-1]
    .endswith(
      ': error: --plugin_trim applies with --aggregator=plugin_trimmed (this run'
      "'s is median); it would be ignored."
    )
  ), stderr
  for name in ('combiner', 'trimmed_0.4', 'trimmed_default'):
    assert results[name][0] == 0, results[name][2][-2000:]
  recorded = json.loads((root / 'combiner' / 'config.json').read_text())
  assert recorded['aggregation']['plugin_trim'] == 0.4
  assert recorded['environment']['plugins']['mycombiner'] == '0.1'

  assert _rows(root / 'combiner') == _rows(root / 'trimmed_0.4') != _rows(root / 'trimmed_default')


def test_a_mechanism_from_a_plugin_package_reaches_the_command_line(plugin_runs):
  """A clipping mechanism installed as pip would (entry point group tff_comp.mechanisms),
  with no edit to tff_comp: the privacy checks read it from its class (it adds no noise,
  it needs --clip_norm), and its run equals the built-in clip's of the same norm (not
  the unclipped mean's)."""
  root, results = plugin_runs
  for name, says in (
    ('mechanism_without_norm', '--aggregator=plugin_clip needs --clip_norm'),
    ('mechanism_with_noise', '--aggregator=plugin_clip adds no noise'),
  ):
    status, _, stderr = results[name]
    assert status != 0 and says in stderr.strip().splitlines()[-1], stderr
  for name in ('mechanism', 'clip', 'mean'):
    assert results[name][0] == 0, results[name][2][-2000:]
  recorded = json.loads((root / 'mechanism' / 'config.json').read_text())
  assert recorded['aggregation']['aggregator'] == 'plugin_clip'

  assert _rows(root / 'mechanism') == _rows(root / 'clip') != _rows(root / 'mean')
