"""The bench's peer protocol (binaries/peers/protocol.py, run by each peer in its own
venv) and its same-minutes timing (bench_timing.time_rounds_between), without the
peers' venvs: what the blocks count, print and return."""

import importlib.util
import io
import pathlib
import sys
from types import SimpleNamespace

import pytest

from tff_comp.binaries import bench_timing

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope='module')
def protocol():
  spec = importlib.util.spec_from_file_location('protocol', ROOT / 'binaries/peers/protocol.py')
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _args(serve: bool, rounds: int = 4, repeats: int = 3):
  return SimpleNamespace(serve=serve, rounds=rounds, repeats=repeats)


def test_serving_warms_up_then_runs_each_requested_block_until_stdin_closes(protocol, monkeypatch):
  monkeypatch.setattr(sys, 'stdin', io.StringIO('2\n5\n'))
  out = io.StringIO()
  monkeypatch.setattr(sys, 'stdout', out)
  rounds = []
  blocks = protocol.Blocks(_args(serve=True))
  protocol.drive(lambda: rounds.append(out.getvalue().count('\n')), blocks)
  lines = out.getvalue().split()
  # 3 warm-up rounds before `ready`; then a block of 2 and one of 5, each answered.
  assert lines[0] == 'ready' and len(lines) == 3
  assert rounds == [0, 0, 0, 1, 1, 2, 2, 2, 2, 2]
  assert [float(v) for v in lines[1:]] == pytest.approx(blocks.timings, abs=1e-6)


def test_without_serving_it_runs_its_repeats_and_reports_their_median(protocol):
  rounds = []
  blocks = protocol.Blocks(_args(serve=False, rounds=4, repeats=3))
  protocol.drive(lambda: rounds.append(1), blocks)
  assert len(rounds) == 3 + 4 * 3 and len(blocks.timings) == 3
  assert blocks.median() == sorted(blocks.timings)[1]


def test_a_peers_block_runs_before_each_of_ours_and_after_the_last():
  events, peer_times = [], iter([1.0, 5.0, 3.0, 2.0])

  def peers():
    events.append('peer')
    return {'P': next(peer_times)}

  ours, medians = bench_timing.time_rounds_between(
    lambda r: events.append(r), rounds=2, repeats=3, peers=peers, warmup=1
  )
  # warm-up, then [peer, warm-up, block] x 3, then a last peer block.
  assert events == [0, 'peer', 0, 0, 1, 'peer', 0, 0, 1, 'peer', 0, 0, 1, 'peer']
  assert medians == {'P': 2.5} and ours >= 0


def test_a_blocks_ratio_is_over_the_plain_blocks_on_either_side():
  """A drift that doubles the machine's speed between blocks leaves each ratio 2."""
  beside = [1.0, 0.5, 0.25]
  assert bench_timing.paired_ratios([1.5, 0.75], beside) == pytest.approx([2.0, 2.0])


def test_without_peers_no_round_is_added():
  events = []
  bench_timing.time_rounds(lambda r: events.append(r), rounds=2, repeats=2, warmup=1)
  assert events == [0, 0, 1, 0, 1]


def test_the_peers_cnn_clients_are_part_6s(protocol):
  """The peers draw part 6's data themselves (they cannot import tff_comp)."""
  import numpy as np

  from tff_comp.binaries import bench_workloads

  ours = list(bench_workloads.cnn_clients(3).values())
  theirs = protocol.cnn_clients(3)
  for (x, y), (x2, y2) in zip(ours, theirs, strict=True):
    np.testing.assert_array_equal(x, x2)
    np.testing.assert_array_equal(y, y2)
