"""Simulated device time (run.devices): a round lasts as its last kept client, the
deadline drops or cuts late clients, over-selection keeps the first to finish, a
trace's windows decide who may be sampled, and a run writes its clock, records its
device settings and resumes to the same clock."""

import csv
import json
import math

import numpy as np
import pytest

from tff_comp import experiment
from tff_comp.run import devices, outputs, sampling
from tff_comp.settings import ConfigError

SIZES = {'a': 10, 'b': 40, 'c': 20, 'd': 5, 'e': 80}
# client: (speed in examples/s, network seconds); round time = n / speed + network.
TRACE = {'a': (10.0, 1.0), 'b': (20.0, 0.5), 'c': (5.0, 2.0), 'd': (50.0, 0.1), 'e': (40.0, 3.0)}
SECONDS = {c: SIZES[c] / s + t for c, (s, t) in TRACE.items()}  # a 2, b 2.5, c 6, d 0.2, e 5


def _trace(tmp_path, windows=None):
  path = tmp_path / 'trace.csv'
  with path.open('w', newline='') as f:
    writer = csv.writer(f)
    writer.writerow(['client_id', 'speed', 'network_seconds', 'windows'])
    for c, (speed, network) in TRACE.items():
      writer.writerow([c, speed, network, (windows or {}).get(c, '')])
  return path


def _sampler(tmp_path, k=5, windows=None, **options):
  opts = devices.DeviceOptions(
    device_model='trace', device_trace=str(_trace(tmp_path, windows)), **options
  )
  clock = devices.DeviceClock(
    devices.draw_devices(list(SIZES), opts, 0), devices.ClientWork(SIZES.get, step_batch=4), opts
  )
  return sampling.ClientSampler(list(SIZES), k, seed=1, clock=clock)


def test_a_round_lasts_as_its_slowest_client_and_the_clock_adds_up(tmp_path):
  sampler = _sampler(tmp_path, k=3)
  clock = 0.0
  for r in range(1, 6):
    clients = sampler.sample(r)
    assert len(clients.reporting) == 3 and clients.late == 0 and clients.work is None
    want = max(SECONDS[c] for c in clients.reporting)
    assert clients.seconds == pytest.approx(want)
    clock += want
    assert clients.clock == pytest.approx(clock)
    assert clients.metrics()['time/simulated_seconds'] == pytest.approx(clock)
  # Any round alone (a resumed run's first) replays the clock to its start.
  assert _sampler(tmp_path, k=3).sample(5) == clients


def test_the_deadline_drops_late_clients_or_cuts_their_steps(tmp_path):
  clients = _sampler(tmp_path, round_deadline=3.0).sample(1)
  assert set(clients.reporting) == {'a', 'b', 'd'} and clients.late == 2
  assert clients.seconds == 3.0 and clients.work is None
  partial = _sampler(tmp_path, round_deadline=3.0, deadline_policy='partial').sample(1)
  assert partial.late == 1 and partial.seconds == 3.0
  share = dict(zip(partial.reporting, partial.work))
  # c: (3 - 2) s of compute at 5 examples/s = 5 of its 20 examples; e: none fits (3 - 3 = 0),
  # it is late.
  assert share == pytest.approx({'a': 1.0, 'b': 1.0, 'c': 0.25, 'd': 1.0})
  # No client late: the round ends at its last arrival, before the deadline.
  assert _sampler(tmp_path, round_deadline=10.0).sample(1).seconds == pytest.approx(6.0)


def test_overselection_keeps_the_first_to_finish(tmp_path):
  clients = _sampler(tmp_path, k=2, overselect=2.5).sample(1)
  assert len(clients.sampled) == 5  # ceil(2.5 x 2), all five
  assert set(clients.reporting) == {'d', 'a'} and clients.late == 3
  assert clients.seconds == pytest.approx(SECONDS['a'])  # the second arrival
  assert _sampler(tmp_path, k=2, overselect=2.5).capacity == 2
  # ceil, not floor: 1.2 x 2 = 2.4 draws 3 (the first two to finish kept).
  assert len(_sampler(tmp_path, k=2, overselect=1.2).sample(1).sampled) == 3
  assert len(_sampler(tmp_path, k=3, overselect=1.5).sample(1).sampled) == 5


def test_windows_decide_who_may_be_sampled_and_an_empty_round_waits(tmp_path):
  windows = {'a': '0-4', 'b': '0-1', 'c': '100-200', 'd': '2-10', 'e': '0-1'}
  sampler = _sampler(tmp_path, k=5, windows=windows)
  first = sampler.sample(1)  # at 0: a, b, e
  assert set(first.sampled) == {'a', 'b', 'e'} and first.seconds == pytest.approx(5.0)
  second = sampler.sample(2)  # at 5: d only
  assert second.sampled == ('d',) and second.clock == pytest.approx(5.2)
  for r in range(3, 100):
    clients = sampler.sample(r)
    if not clients.sampled:
      break
    assert clients.sampled == ('d',)
  # From 10 nobody is available: the round waits for c's window at 100.
  assert clients.clock == pytest.approx(100.0) and clients.reporting == ()
  assert sampler.sample(r + 1).sampled == ('c',)
  # After c's window (200) none opens: the run ends with one line, not a traceback.
  with pytest.raises(ConfigError, match='windows have ended'):
    for later in range(r + 2, r + 100):
      sampler.sample(later)


def test_lognormal_devices_come_from_the_seed_around_their_medians():
  ids = [f'c{i}' for i in range(20000)]
  opts = devices.DeviceOptions(
    device_model='lognormal',
    device_speed=50.0,
    device_speed_sigma=0.8,
    network_seconds=2.0,
    network_sigma=0.3,
  )
  drawn = devices.draw_devices(ids, opts, seed=7)
  speeds = np.log([d.speed for d in drawn.values()])
  networks = np.log([d.network for d in drawn.values()])
  assert np.median(speeds) == pytest.approx(math.log(50.0), abs=0.03)
  assert speeds.std() == pytest.approx(0.8, rel=0.03)
  assert np.median(networks) == pytest.approx(math.log(2.0), abs=0.01)
  assert networks.std() == pytest.approx(0.3, rel=0.03)
  assert devices.draw_devices(ids[:5], opts, seed=7) == {c: drawn[c] for c in ids[:5]}
  assert devices.draw_devices(ids[:5], opts, seed=8) != {c: drawn[c] for c in ids[:5]}


@pytest.mark.parametrize(
  'settings,message',
  [
    (dict(round_deadline=5.0), 'need a device model'),
    (dict(device_model='trace'), '--device_trace goes with'),
    (dict(device_model='lognormal', straggler_rate=0.2), 'makes its own stragglers'),
    (dict(device_model='trace', device_trace='/nonexistent.csv'), '/nonexistent.csv'),
    (dict(device_model='lognormal', overselect=0.5), '--overselect must be >= 1.0'),
    # Settings the run would ignore (one rule: settings.setting(applies_when=...)).
    (dict(device_speed=50.0), '--device_speed applies with --device_model=lognormal'),
    (
      dict(device_model='trace', device_trace=__file__, network_sigma=0.1),
      '--network_sigma applies with --device_model=lognormal',
    ),
    (
      dict(device_model='lognormal', deadline_policy='partial'),
      '--deadline_policy applies with --round_deadline set',
    ),
    (dict(concurrency=5), "--concurrency applies with --mode=async \\(this run's is sync\\)"),
    (dict(max_staleness=3), '--max_staleness applies with --mode=async'),
    (dict(device_model='trace', device_trace='{twice}'), "line 3: client '0' has a row already"),
    (dict(device_model='trace', device_trace='{short}'), 'has no row for 5 of the clients'),
  ],
)
def test_bad_device_settings_are_one_line(settings, message, tmp_path):
  """One line, and the output directory untouched (no lock file left: a trace was
  read only after the run locked its directory)."""
  traces = {'twice': [('0', 1, 1), ('0', 2, 1)], 'short': [('0', 1, 1)]}
  for name, rows in traces.items():
    with open(tmp_path / f'{name}.csv', 'w', newline='') as f:
      csv.writer(f).writerows([('client_id', 'speed', 'network_seconds'), *rows])
  settings = {
    k: v.format(**{n: tmp_path / f'{n}.csv' for n in traces}) if isinstance(v, str) else v
    for k, v in settings.items()
  }
  with pytest.raises(ConfigError, match=message):
    experiment.train(
      'fedavg',
      'quadratic',
      rounds=1,
      output_dir=str(tmp_path / 'run'),
      show_progress=False,
      **settings,
    )
  assert not (tmp_path / 'run').exists()


def _train(tmp_path, name, rounds, **settings):
  experiment.train(
    'fedavg',
    'quadratic',
    rounds=rounds,
    clients_per_round=3,
    eval_period=2,
    output_dir=str(tmp_path / name),
    show_progress=False,
    device_model='lognormal',
    device_speed=20.0,
    round_deadline=1.5,
    deadline_policy='partial',
    overselect=1.5,
    **settings,
  )
  _, rows, _ = outputs.whole_rows(tmp_path / name / 'metrics.csv')
  return rows


def test_a_run_writes_its_clock_records_its_devices_and_resumes_to_the_same_clock(tmp_path):
  whole = _train(tmp_path, 'whole', 6, checkpoint_every=3)
  clock = [float(r['time/simulated_seconds']) for r in whole[1:]]
  assert np.all(np.diff(clock) > 0)
  np.testing.assert_allclose(
    np.cumsum([float(r['time/round_seconds']) for r in whole[1:]]), clock, rtol=1e-12
  )
  assert max(float(r['time/round_seconds']) for r in whole[1:]) <= 1.5
  # The deadline turned clients away and cut others' steps (FedAvg ran their share).
  assert all(float(r['participation/late']) > 0 for r in whole[1:])
  assert any(float(r['participation/straggling']) > 0 for r in whole[1:])
  recorded = json.loads((tmp_path / 'whole' / 'config.json').read_text())['devices']
  assert recorded['round_deadline'] == 1.5 and recorded['overselect'] == 1.5
  _train(tmp_path, 'cut', 3, checkpoint_every=3)
  resumed = _train(tmp_path, 'cut', 6, checkpoint_every=3, resume=True)
  for a, b in zip(whole, resumed, strict=True):
    for column in (
      'time/simulated_seconds',
      'participation/late',
      'train/client_work/train_loss',
      'participation/straggling',
    ):
      assert a[column] == b[column], column


@pytest.mark.parametrize(
  'algorithm,settings,examples',
  [
    # local_epochs x n_i examples.
    ('fedavg', dict(local_epochs=3, batch_size=2), lambda n: 3 * n),
    # local_steps x batch_size x the rule's batches per step (MAML's three), any n_i.
    ('per_fedavg', dict(algorithm_options=dict(local_steps=4), batch_size=2), lambda n: 4 * 2 * 3),
  ],
)
def test_a_clients_time_is_the_local_work_its_algorithm_does(
  tmp_path, algorithm, settings, examples
):
  path = tmp_path / 'trace.csv'
  ids = [str(i) for i in range(6)]
  path.write_text(
    'client_id,speed,network_seconds\n'
    + ''.join(f'{c},{10 * (i + 1)},{i}\n' for i, c in enumerate(ids))
  )
  prepared = experiment.prepare(
    experiment.ExperimentConfig.of(
      algorithm=algorithm,
      task='quadratic',
      device_model='trace',
      device_trace=str(path),
      output_dir=str(tmp_path / 'run'),
      **settings,
    )
  )
  data = prepared.task.train_data
  clock = devices.clock_for(prepared.config.devices, data, prepared.build(), seed=0)
  for i, c in enumerate(ids):
    n = sum(1 for _ in data.create_tf_dataset_for_client(c))
    assert clock.seconds(c) == pytest.approx(examples(n) / (10 * (i + 1)) + i), c
