"""Slipstream's Airflow extensions: task wrappers, the training launcher, the UI plugin."""
