"""Data-quality gates and training-data insight.

Everything here follows the data set's feature spec: `gate.run_gate` validates a day (or a window)
of `samples` at a pinned snapshot with a Great Expectations suite built from the spec, over
columnar aggregates, within bounds the data set sets, learns robustly from its history or a run
overrides (`bounds`); `profiles.profile_table` builds mergeable feature profiles; `drift_days`
judges each day's features against chance at its size and their usual day-to-day movement
(`movement`), `skew` the stream against the batch rows of the same hours; `report.render_report`
writes a run's static HTML insight report, whose findings carry what to do (`wording`). Great
Expectations is imported lazily: it pulls in pyspark, which the core library must not import at
import time.
"""
