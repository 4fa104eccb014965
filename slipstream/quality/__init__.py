"""Data-quality gates and training-data insight.

Everything here follows the data set's feature spec: `gate.run_gate` validates a day (or a window)
of `samples` at a pinned snapshot with a Great Expectations suite built from the spec, over
columnar aggregates, within bounds the data set sets, learns or a run overrides (`bounds`);
`profiles.profile_table` builds mergeable feature profiles; `drift` compares them across days and
between batch and stream; `report.render_report` writes a run's static HTML insight report. Great
Expectations is imported lazily: it pulls in pyspark, which the core library must not import at
import time.
"""
