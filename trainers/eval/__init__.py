"""Scoring a model on rows (`scoring`), time-based validation and early stopping (`validation`),
the baselines every run is judged against (`baselines`) and the promotion scores (`judge`)."""
