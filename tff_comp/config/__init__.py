"""A run's configuration: the records of its settings (`experiment_config`,
`run_settings`, `client_settings`, `aggregation_settings`, `privacy_settings`), what they
build (`build_arguments`) and where a run writes (`run_directory`)."""
