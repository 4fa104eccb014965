"""The trainer's configuration: the typed sections (`schema`), their parsing from files and `--set`
overrides (`parse`), and a planned run's config from its `plan.json` (`plan`)."""
