"""The local stack's joiner: `stack up --joiner` runs it, the generator's stream goes in as raw
impressions and clicks, and the samples it makes after T are the generator's own samples (the
reference the Spark job is tested against), field by field; `stack down` stops it by PID."""

from __future__ import annotations

from datetime import date

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from joiner_fixtures import read_topic

from slipstream.dev import stack
from slipstream.dev.datagen import GeneratorConfig, generate
from slipstream.dev.joiner_wait import wait_for_joiner
from slipstream.dev.raw_stream import produce_raw_stream
from slipstream.samples.codec import decode_samples
from slipstream.samples.spec import load_spec
from slipstream.settings import Settings

pytestmark = pytest.mark.integration


def test_stack_joiner_turns_the_generated_raw_stream_into_the_generators_samples(settings: Settings) -> None:
    import dataclasses

    settings = dataclasses.replace(settings, kafka_port=stack.free_port())
    spec = load_spec("synthetic")
    cfg = GeneratorConfig(start_day=date(2026, 11, 1), days=1, impressions_per_day=2000, stream_minutes=90, seed=5)
    data = generate(cfg, settings.raw_dir)
    state = stack.up(settings, airflow=False, joiner=True)
    try:
        joiner = state.services["joiner"]
        bootstrap = state.services["kafka"].address
        produce_raw_stream(bootstrap, spec, data.stream_events, 4)
        outcome = wait_for_joiner(joiner.address, data.stream.num_rows, deadline_s=180)
        assert outcome.committed == data.stream.num_rows and outcome.ended_by == "done", outcome.explain()
        msgs = read_topic(bootstrap, settings.topic, data.stream.num_rows, idle_s=1)
    finally:
        stopped = stack.down(settings)
    assert any(s.startswith("joiner") for s in stopped) and not stack.pid_alive(joiner.pid)
    got = decode_samples([m.value() for m in msgs], spec).table
    assert got.num_rows == data.stream.num_rows
    t_us = int(cfg.t_handoff.timestamp() * 1_000_000)

    def after_t(t: pa.Table) -> list[dict]:
        t = t.filter(pc.greater_equal(pc.cast(t["event_time"], pa.int64()), t_us))
        return sorted(t.to_pylist(), key=lambda r: r["sample_id"])

    # before T the generator's histories reach into the batch day, which the stream never saw
    want, have = after_t(data.stream), after_t(got)
    assert len(want) > 100 and sum(r["label"] for r in want) > 5
    for w, h in zip(want, have):
        for col, v in w.items():
            assert h[col] == pytest.approx(v, rel=1e-6) if isinstance(v, float) else h[col] == v, (w["sample_id"], col)
