"""The training image: `torchrun -m trainers.train`."""
