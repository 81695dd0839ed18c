"""Part 9 of `bench.py` (`--workload=aggregators`): what an aggregator chain costs a
round, part 1's FedAvg round on the lasso shape (10 clients x 128 examples, d = 1024):

  in-process lanes: the plain weighted mean against clipping + 8-bit quantization,
    clipping + Hadamard rotation + 8-bit quantization, top-1% with error feedback, the
    coordinate-wise median and Krum (every client alike);
  TFF's runtime: TFF's `build_weighted_fed_avg` (datasets built in Python, as part 1's
    (c)) with its default mean against `tff.learning.compression_aggregator()` (adaptive
    zeroing and clipping; it quantizes only tensors above 20,000 values, so lasso's
    1,024 are sent as floats), and tff_comp's clip + 8-bit chain placed on TFF's runtime
    (`learning_process.chain_factory`).

Each chain's blocks of rounds alternate with the plain mean's (at least 5 of each, the
plain one's before the first and after every one); a block's ratio is its time over the
mean of the plain blocks on either side (the machine's speed drifts over minutes, and
each chain is built after the last in one process), the chain's the median of its
blocks'; targets from issue #74.
"""

import statistics
import time

from tensorflow_federated import learning as tff_learning

from tff_comp import registry
from tff_comp.binaries import bench_timing as timing
from tff_comp.ops import aggregators as agg
from tff_comp.runtime import choice, inprocess
from tff_comp.tasks import lasso

CLIENTS, BATCH, LR = 10, 10, 1e-3

CHAINS = {
  'clip + 8-bit quantization': (agg.Chain((agg.Clip(1.0), agg.Quantize(8)), agg.Mean()), 1.2),
  'clip + rotation + 8-bit': (
    agg.Chain((agg.Clip(1.0), agg.Rotate(), agg.Quantize(8)), agg.Mean()),
    1.5,
  ),
  'top-1% + error feedback': (agg.Chain((agg.ErrorFeedback(agg.TopK(0.01)),), agg.Mean()), 1.2),
  'median': (agg.Chain((), agg.Median()), 1.5),
  'krum (f = 1)': (agg.Chain((), agg.Krum(1)), 1.2),
  'nnm + krum (f = 1)': (agg.Chain((), agg.Krum(1), agg.NearestNeighbourMixing(1)), None),
  'bucketing (s = 2) + krum': (agg.Chain((), agg.Krum(1), agg.Bucketing(2)), None),
}


def _algorithm(chain: agg.Chain | None, model):
  """FedAvg aggregating by `chain`, an Algorithm (a chain with error feedback has no
  TFF process: `chain_factory.why_not`)."""
  weighting = 'examples' if chain is None or chain.weighted else 'uniform'
  return registry.get_algorithm('fedavg').build(
    model,
    client_learning_rate=LR,
    batch_size=BATCH,
    client_weighting=weighting,
    model_aggregator=chain,
  )


def part9(rounds: int, repeats: int) -> None:
  task = lasso.build_lasso_task(dataset='I')
  ids = task.train_data.client_ids
  picks = timing.selections(len(ids), CLIENTS, 3 + rounds * repeats + 10)

  def lanes(chain):
    runner = inprocess.build(_algorithm(chain, task.model), task.train_data, engine='lanes')
    return timing.round_runner(runner, ids, picks)

  plain_round = lanes(None)
  for r in range(3):  # its tracing and caches, before its first timed block
    plain_round(r)

  def plain_block() -> dict[str, float]:
    start = time.perf_counter()
    for r in range(rounds):
      plain_round(r)
    return {'plain': (time.perf_counter() - start) / rounds}

  blocks = max(repeats, 5)
  print(
    f'Part 9: aggregator chains, FedAvg round on lasso I ({CLIENTS} clients, d={lasso.DIM});'
    f" medians of {blocks} blocks of {rounds} rounds, alternating with the plain mean's"
  )
  for name, (chain, target) in CHAINS.items():
    timings, others = timing.blocks_between(lanes(chain), rounds, blocks, plain_block)
    plains = [block['plain'] for block in others]
    ratios = timing.paired_ratios(timings, plains)
    goal = f' (target <= {target})' if target else ''
    print(
      f'  lanes  {name:28s} {statistics.median(timings):.5f} s/round; plain mean'
      f' {statistics.median(plains):.5f}; ratio {statistics.median(ratios):.2f}{goal},'
      f' blocks {min(ratios):.2f}-{max(ratios):.2f}'
    )

  def builtin(aggregator):
    process = tff_learning.algorithms.build_weighted_fed_avg(
      task.model,
      tff_learning.optimizers.build_sgdm(LR),
      tff_learning.optimizers.build_sgdm(1.0),
      model_aggregator=aggregator,
    )
    state = [process.initialize()]

    def run_round(r):
      datasets = [
        task.train_data.create_tf_dataset_for_client(ids[i]).batch(BATCH) for i in picks[r]
      ]
      state[0] = process.next(state[0], datasets).state

    return timing.time_rounds(run_round, rounds, repeats)

  plain = builtin(None)
  compressed = builtin(tff_learning.compression_aggregator())
  print(
    f'  TFF    build_weighted_fed_avg, compression_aggregator {compressed:.4f} s/round;'
    f' its default mean {plain:.4f}; ratio {compressed / plain:.2f}'
  )

  def on_tff(chain):
    runner, _ = choice.runner_for(_algorithm(chain, task.model), task.train_data, 'tff')
    return timing.time_rounds(timing.round_runner(runner, ids, picks), rounds, repeats)

  chain = CHAINS['clip + 8-bit quantization'][0]
  plain, timed = on_tff(None), on_tff(chain)
  print(
    f'  TFF    tff_comp fedavg, clip + 8-bit chain placed on TFF {timed:.4f} s/round;'
    f' plain {plain:.4f}; ratio {timed / plain:.2f}'
  )
