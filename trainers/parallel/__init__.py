"""Process group, device and collectives (`dist`), the data-parallel exchange of the tables' sparse
gradients (`grad_exchange`) and TorchRec's sharded tables (`sharding`)."""
