"""What a run shows while and after it trains: metrics and progress logs (`run_metrics`) and the
per-sample audit of what was trained (`sample_audit`)."""
