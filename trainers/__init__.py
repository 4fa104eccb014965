"""The training image: `torchrun -m trainers.train --config FILE` trains a CTR model over a pinned
Iceberg snapshot, then continues on the Kafka stream from the handoff point (docs/trainer.md)."""
