"""spark-submit entry points and pure DataFrame transforms."""
