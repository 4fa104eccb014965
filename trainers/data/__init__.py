"""Data of the trainer: the Iceberg batch window, the Kafka tail and the mix of both; the rows they
yield (`rows`), the window's dense statistics, the stream's feature profile, and the run's progress
through them with its resume point on any world size (`progress`)."""
