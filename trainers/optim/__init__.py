"""Optimizer groups and learning rates (`groups`), the stream phase's drift-driven rate (`drift_gauge`)
and the users the batch phase trained (`known_users`), which that gauge compares against."""
