"""`bench.py --workload=grid` (part 8): a reproduction's whole grid end to end, batched
trials against one run after another, in the same bench run on the same machine."""

import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time

_HERE = pathlib.Path(__file__).resolve().parent


def _tables(path: pathlib.Path) -> list[str]:
  """results.md's table rows (its timing line left out)."""
  return [line for line in path.read_text().splitlines() if line.startswith('|')]


def part8(experiment: str, rounds: int, parallel: int) -> None:
  """`reproduce.py --experiment=<experiment>` (every method, configuration and seed) with
  batched trials, then with `--nobatch_trials` (each (algorithm, seed) group's runs one
  after another, as before), both with `--parallel`; wall time of each, whether the
  tables agree, and the batched grid's floor: the time of its compiled rounds alone."""
  print(
    f'Part 8: reproduce.py --experiment={experiment} --rounds={rounds}'
    f' --parallel={parallel}, end to end (load average'
    f' {os.getloadavg()[0]:.2f} at the start)'
  )
  seconds, batched_out = {}, ''
  with tempfile.TemporaryDirectory() as root:
    for label, extra in (('batched', '--batch_trials'), ('one by one', '--nobatch_trials')):
      out = pathlib.Path(root) / label.replace(' ', '_')
      start = time.monotonic()
      done = subprocess.run(
        [
          sys.executable,
          str(_HERE / 'reproduce.py'),
          f'--experiment={experiment}',
          f'--rounds={rounds}',
          f'--parallel={parallel}',
          f'--output_dir={out}',
          extra,
        ],
        capture_output=True,
        text=True,
        check=False,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3'),
      )
      seconds[label] = time.monotonic() - start
      if label == 'batched':
        batched_out = done.stdout
      if done.returncode:
        print(f'  {label}: failed ({done.stderr.strip().splitlines()[-1:]})')
        return
      print(f'  (h) {label:10s} {seconds[label]:7.1f} s')
    same = _tables(pathlib.Path(root) / 'batched' / experiment / 'results.md') == _tables(
      pathlib.Path(root) / 'one_by_one' / experiment / 'results.md'
    )
  print(
    f'  batched / one by one = {seconds["batched"] / seconds["one by one"]:.2f}'
    f' ({seconds["one by one"] / seconds["batched"]:.1f}x faster, target 5x);'
    f' tables identical: {"yes" if same else "NO"}'
  )
  # The floor of the batched grid: its groups' compiled rounds (rounds 2 on, as each
  # group says), shared by the processes at best.
  compiled = sum(float(m) for m in re.findall(r'the compiled round ([\d.]+) s', batched_out))
  print(
    f"  the batched groups' compiled rounds alone: {compiled:.1f} s, {compiled / parallel:.1f} s"
    f' on {parallel} processes: at most {seconds["one by one"] * parallel / compiled:.1f}x'
    " faster than one by one were imports, compiles, trials' loops and evaluations free"
  )
