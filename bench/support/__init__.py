"""What the benchmarks share and are not benchmarks themselves: the latency relay, the remote store
behind it, the warmup measurements."""
