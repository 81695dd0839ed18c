"""The run driver: a run's loop over any runtime (`training_loop`), its callbacks
(`callbacks`: evaluation, metrics, progress, checkpoints), what it writes (`outputs`,
`checkpoints`), its resolved settings (`run_settings`), which clients each round trains
(`sampling`), simulated device time (`devices`) and buffered asynchronous steps
(`buffered_async`)."""
