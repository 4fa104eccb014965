"""Benchmarks: each module has `main(argv) -> dict`, measures a baseline in the same run and
reports ratios. Run with `slipstream bench NAME --json`."""
