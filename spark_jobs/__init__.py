"""Spark entry points (spark-submit) and the pure DataFrame transforms they are built from."""
