"""Checkpoints: the atomic store (`store`), the model's sharded tensors (`tensors`), data state in
files that cannot run code (`statefile`) and the `Stateful` protocol every resumable piece follows
(`stateful`)."""
