"""Slipstream: train CTR models on batch history and the live stream in one job."""

__version__ = "0.1.0"
