"""`bench.py --workload=grid` (part 8): a reproduction's whole grid end to end, with
`reproduce.py`'s defaults (batched trials, its processes chosen for the machine) against
one run after another on `--parallel` processes, in the same bench run on the same
machine."""

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


def part8(experiment: str, rounds: int, parallel: int | None) -> None:
  """`reproduce.py --experiment=<experiment>` (every method, configuration and seed) with
  its defaults, then with `--nobatch_trials --parallel=<parallel>` (each (algorithm,
  seed) group's runs one after another; None: one process a core); wall time of each,
  whether the tables agree, and the defaults' floor: the time of their compiled rounds
  alone."""
  parallel = parallel or len(os.sched_getaffinity(0))
  print(
    f'Part 8: reproduce.py --experiment={experiment} --rounds={rounds}, end to end (load'
    f' average {os.getloadavg()[0]:.2f} at the start)'
  )
  ways = (
    ('defaults', []),
    (f'--nobatch_trials --parallel={parallel}', ['--nobatch_trials', f'--parallel={parallel}']),
  )
  seconds, outputs = {}, {}
  with tempfile.TemporaryDirectory() as root:
    for k, (label, extra) in enumerate(ways):
      start = time.monotonic()
      done = subprocess.run(
        [
          sys.executable,
          str(_HERE / 'reproduce.py'),
          f'--experiment={experiment}',
          f'--rounds={rounds}',
          f'--output_dir={pathlib.Path(root) / str(k)}',
          *extra,
        ],
        capture_output=True,
        text=True,
        check=False,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3'),
      )
      seconds[label], outputs[label] = time.monotonic() - start, done.stdout
      if done.returncode:
        print(f'  {label}: failed ({done.stderr.strip().splitlines()[-1:]})')
        return
      print(f'  (h) {label:32s} {seconds[label]:7.1f} s')
    same = _tables(pathlib.Path(root) / '0' / experiment / 'results.md') == _tables(
      pathlib.Path(root) / '1' / experiment / 'results.md'
    )
  defaults, separate = (seconds[label] for label, _ in ways)
  chose = re.search(r'reproduce\.py: (.*) \(--parallel sets it\)', outputs['defaults'])
  print(f'  the defaults: {chose.group(1) if chose else "?"}, trials batched')
  print(
    f'  defaults / one by one = {defaults / separate:.2f} ({separate / defaults:.1f}x faster;'
    f' target: at most 1.00); tables identical: {"yes" if same else "NO"}'
  )
  # The floor of the defaults: their groups' compiled rounds (rounds 2 on, as each group
  # says), shared by the processes at best.
  compiled = sum(
    float(m) for m in re.findall(r'the compiled round ([\d.]+) s', outputs['defaults'])
  )
  processes = int(re.search(r'on (\d+) process', chose.group(1)).group(1)) if chose else 1
  print(
    f"  the defaults' compiled rounds alone: {compiled:.1f} s, {compiled / processes:.1f} s"
    f' on {processes} process(es)'
  )
