"""Training as run.py trains, optionally stopped by a Ctrl-C in a given round: the
resume tests' interrupted runs."""

from tff_comp import experiment


def train(config: experiment.ExperimentConfig, interrupt_at: int | None = None, show=False):
  """Prepares and trains `config`; with `interrupt_at`, KeyboardInterrupt is raised in
  the runtime's `interrupt_at`-th round (rounds before it done and saved as the
  checkpoint schedule has it), as a Ctrl-C there would."""
  prepared = experiment.prepare(config)
  runner = experiment.build_runner(prepared)
  if interrupt_at is not None:
    process, calls = runner.runtime, []

    class Interrupted:  # the process, with a Ctrl-C in round `interrupt_at`
      def __getattr__(self, name):
        return getattr(process, name)

      def next(self, state, ids, work=None):
        calls.append(1)
        if len(calls) == interrupt_at:
          raise KeyboardInterrupt
        return process.next(state, ids, work)

    runner.runtime = Interrupted()
  return experiment.train_runner(prepared, runner, show_progress=show)
