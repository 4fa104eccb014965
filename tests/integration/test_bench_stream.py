"""`slipstream bench stream` at toy sizes: both readers read every record of each codec's topic, the
trainer trained every fresh latency record, and the result carries its ratio and latency fields (no
timing goals)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration


def test_bench_stream_reads_everything_and_reports_latency() -> None:
    from bench.stream import main

    out = main(["--json", "--samples", "3000", "--partitions", "4", "--repeat", "1", "--rate", "400",
                "--seconds", "1.5", "--deadline-s", "60"])
    assert out["bench"] == "stream"
    assert out["records_from_handoff"] == 3000  # every record is after T: the handoff starts at 0
    assert out["records_stream"] == out["records_raw"] == 3000
    assert 0 < out["fresh_rows_stream"] < 3000  # held-out rows are kept out of training
    assert out["vs_raw"] > 0 and out["raw_samples_per_s"] > 0 and out["stream_samples_per_s"] > 0
    # each codec has its topic of the same samples, read in full by both readers
    assert out["codec"] == "binary" and set(out["by_codec"]) == {"binary", "json"}
    for run in out["by_codec"].values():
        assert run["records_stream"] == run["records_raw"] == 3000
        assert run["fresh_rows_stream"] == out["fresh_rows_stream"]
    assert out["by_codec"]["binary"]["value_bytes_per_record"] < out["by_codec"]["json"]["value_bytes_per_record"]
    assert out["latency_records"] == 600
    assert out["latency_rows_trained"] == out["latency_rows_expected"] > 0
    assert out["latency_stop_reason"].startswith("trained")
    assert 0 < out["latency_ms_p50"] <= out["latency_ms_p99"] <= out["latency_ms_max"]
