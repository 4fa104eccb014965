"""Data sources of the trainer: the Iceberg batch window, the Kafka tail and the mix of both."""
