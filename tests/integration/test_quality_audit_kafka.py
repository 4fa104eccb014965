"""The report's exactly-once audit reads the run's Kafka range from a real broker."""

from __future__ import annotations

import dataclasses
import re
from datetime import UTC, datetime, timezone
from pathlib import Path

import pyarrow as pa
import pytest

from slipstream.lake.iceberg import get_catalog
from slipstream.stream.kafka import end_offsets, produce_samples
from slipstream.quality.report import render_report
from slipstream.settings import Settings
from tests.quality_fixtures import DAYS, day_of, fill_samples, reference_days, write_fake_run

pytestmark = pytest.mark.integration


def _kafka_row(text: str) -> tuple[str, ...]:
    m = re.search(r"<tr><td>kafka</td><td>0</td><td>([\d,]+)</td><td>([\d,]+)</td><td>(\d+)</td><td>(\d+)</td><td>(\d+)</td><td>([^<]*)</td>", text)
    assert m is not None, text
    return m.groups()


@pytest.mark.parametrize("lose_stream", [0, 2])
def test_audit_checks_the_kafka_range(settings: Settings, kafka_bootstrap: str, topic: str, lose_stream: int) -> None:
    settings = dataclasses.replace(settings, kafka_bootstrap=kafka_bootstrap, topic=topic)
    days = reference_days()
    last = str(day_of(DAYS - 1))
    window = {k: v for k, v in days.items() if k != last}
    snap = fill_samples(get_catalog(settings), settings.namespace, window)
    d = day_of(DAYS - 1)
    t_handoff = datetime(d.year, d.month, d.day, tzinfo=timezone.utc)
    # the online joiner also re-emits the last minutes before T: the trainer must drop them
    overlap = window[str(day_of(DAYS - 2))].slice(3_900)
    stream = pa.concat_tables([overlap, days[last].slice(0, 1_500)])
    produce_samples(kafka_bootstrap, topic, stream, progress_every=0)
    final = end_offsets(kafka_bootstrap, topic)
    write_fake_run(
        Path(settings.runs_dir), "run-k", window, snapshot_id=snap, t_handoff=t_handoff, stream=stream,
        handoff_offsets={p: 0 for p in final}, final_offsets=final, lose_stream=lose_stream,
    )
    text = render_report(settings, "run-k").read_text()
    expected, trained, lost, dup, unexpected, lost_ids = _kafka_row(text)
    n_expected = int(expected.replace(",", ""))
    assert 1_300 < n_expected < 1_500  # 1,500 after T minus the ~10 % holdout
    assert (lost, dup, unexpected) == (str(lose_stream), "0", "0")
    assert "100 had event_time &lt; t_handoff" in text or "100 had event_time < t_handoff" in text
    if lose_stream:
        assert "NOT exactly once" in text and lost_ids.count("imp-") == 2
    else:
        assert "exactly once: 0 lost, 0 duplicated" in text


def test_records_committed_after_an_abort_that_the_run_never_trained_are_lost_by_partition_and_offset(
        settings: Settings, kafka_bootstrap: str) -> None:
    """The run read up to an aborted transaction, passed what followed without training it, and
    stopped "caught up": its final position is before the abort. Counted against what was
    committed up to the stop (a fresh reader through the abort), the records after it are lost,
    named by partition and offsets (audited up to the final position, as before, it said 0 lost)."""
    import json

    from stream_fixtures import write_transactions

    from slipstream.samples.codec import encode_samples

    topic = "audit-after-abort"
    settings = dataclasses.replace(settings, kafka_bootstrap=kafka_bootstrap, topic=topic)
    days = reference_days()
    last = str(day_of(DAYS - 1))
    window = {k: v for k, v in days.items() if k != last}
    snap = fill_samples(get_catalog(settings), settings.namespace, window)
    d = day_of(DAYS - 1)
    t_handoff = datetime(d.year, d.month, d.day, tzinfo=UTC)
    trained, passed = days[last].slice(0, 300), days[last].slice(300, 100)
    encode = lambda t: encode_samples(t, "json")  # noqa: E731
    layout = write_transactions(kafka_bootstrap, topic, [(True, encode(trained)), (False, encode(trained.slice(0, 50))),
                                                         (True, encode(passed))], txn_id="audit-joiner")
    (first_aborted, marker), = layout.aborted
    run = write_fake_run(Path(settings.runs_dir), "run-abort", window, snapshot_id=snap, t_handoff=t_handoff,
                         stream=trained, handoff_offsets={0: 0}, final_offsets={0: first_aborted})
    metrics = json.loads((run / "metrics.json").read_text())
    metrics.update(stop_offsets={"0": layout.end}, kafka_lag_at_stop=0, topic=topic)
    (run / "metrics.json").write_text(json.dumps(metrics))
    text = render_report(settings, "run-abort").read_text()
    expected, got, lost, dup, unexpected, _ = _kafka_row(text)
    from slipstream.samples.schema import is_holdout

    n_passed = int((~is_holdout(passed.column("sample_id"))).sum())
    assert int(lost) == n_passed > 80 and (dup, unexpected) == ("0", "0")
    assert "NOT exactly once" in text
    assert f"partition 0 offsets {marker + 1}..{layout.end - 2}" in text  # where the lost records lie
    assert f"yet {n_passed} committed records it should have trained lay beyond its final position" in text
    assert "Lag at the stop, from committed records" in text and "partition 0: 100" in text
