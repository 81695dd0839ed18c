"""Timing helpers of `bench.py`: the median seconds a round, over repeats."""

from collections.abc import Callable
import statistics
import time

import numpy as np


def time_rounds(run_round, rounds: int, repeats: int, warmup: int = 3) -> float:
  """Median seconds a round of `run_round(r)` over `repeats` blocks of `rounds`, after
  `warmup` rounds (tracing and caches)."""
  return time_rounds_between(run_round, rounds, repeats, dict, warmup)[0]


def time_rounds_between(
  run_round, rounds: int, repeats: int, peers: Callable[[], dict[str, float]], warmup: int = 3
) -> tuple[float, dict[str, float]]:
  """(`time_rounds` of `run_round`, each peer's median), timed by `blocks_between`."""
  timings, blocks = blocks_between(run_round, rounds, repeats, peers, warmup)
  medians = {name: statistics.median(block[name] for block in blocks) for name in blocks[0]}
  return statistics.median(timings), medians


def blocks_between(
  run_round, rounds: int, repeats: int, peers: Callable[[], dict[str, float]], warmup: int = 3
) -> tuple[list[float], list[dict[str, float]]]:
  """`run_round(r)`'s seconds a round in each of `repeats` blocks of `rounds`, and the
  peers' blocks ({name: s/round}, `peers()`), one before each of ours and one after the
  last, so that all are timed in the same minutes; after a peers' block, `warmup`
  untimed rounds (caches and threads the peers' processes took)."""
  for r in range(warmup):
    run_round(r)
  timings, blocks = [], [peers()]
  for _ in range(repeats):
    if blocks[-1]:
      for r in range(warmup):
        run_round(r)
    start = time.perf_counter()
    for r in range(rounds):
      run_round(r)
    timings.append((time.perf_counter() - start) / rounds)
    blocks.append(peers())
  return timings, blocks


def paired_ratios(timings: list[float], beside: list[float]) -> list[float]:
  """Each block's time over the mean of the two blocks `beside` it (`blocks_between`'s
  order: beside[i] before timings[i], beside[i + 1] after): a drift of the machine's
  speed over minutes moves both sides of each ratio alike."""
  return [t / (0.5 * (beside[i] + beside[i + 1])) for i, t in enumerate(timings)]


def selections(num_clients: int, per_round: int, total: int):
  rng = np.random.default_rng(0)
  return [rng.choice(num_clients, per_round, replace=False) for _ in range(total)]


def round_runner(process, ids, picks):
  """run_round(r) for a process taking client ids (either runtime); a streaming
  runtime reads the next round's clients meanwhile, as the simulation loop has it."""
  state = [process.initialize()]
  prefetch = getattr(process, 'prefetch', None)

  def run_round(r):
    if prefetch is not None and r + 1 < len(picks):
      prefetch([ids[i] for i in picks[r + 1]])
    state[0] = process.next(state[0], [ids[i] for i in picks[r]]).state
    process.get_model_weights(state[0])  # waits for the round (a GPU runs async)

  return run_round
