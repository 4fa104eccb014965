"""Six hours of impressions and clicks arrive in bursts, with the joiner started before, during
and after them: it joins every impression the batch path joins, with the batch path's labels and
features. In each burst the click shipper is a moment ahead of the impression shipper (two
producers, as two log pipelines): the click input resumes first, its newest time an hour ahead
of the impressions still on their way. A watermark that let an input at its end stop holding the
task back after a pause (rather than by its end offset) closed those windows and dead-lettered
the impressions as late."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import pytest
from joiner_fixtures import batch_samples, make_events, produce_raw, read_topic, start_joiner

from slipstream.joiner.raw_topics import raw_producer
from slipstream.samples.codec import decode_samples
from tests.integration.test_joiner import SPEC, _wait_assigned, assert_same_samples

pytestmark = pytest.mark.integration

HOURS, BURSTS = 6, 6
PAUSE_S = 1.5
"""Between bursts: longer than the joiner's input_idle_s (1 s), shorter than its idle flush (4 s)."""


def _bursts(imps: list[dict[str, Any]], clicks: list[dict[str, Any]]) -> list[tuple[list, list]]:
    """The events cut by event time into BURSTS equal spans (clicks go with the span they happened in)."""
    t0, span = imps[0]["ts"], HOURS * 3600 * 1_000_000 // BURSTS + 1
    out: list[tuple[list, list]] = [([], []) for _ in range(BURSTS + 1)]
    for r in imps:
        out[(r["ts"] - t0) // span][0].append(r)
    for c in clicks:
        out[min((c["ts"] - t0) // span, BURSTS)][1].append(c)
    return out


STARTS = ("before", "during", "after")


def test_a_backlog_in_bursts_joins_every_impression_the_batch_path_joins(kafka_bootstrap: str, tmp_path: Path) -> None:
    """One stream of bursts on three topic pairs at once; a joiner per pair, started before the
    first burst, halfway through, and after the last."""
    imps, clicks, labels = make_events(2400, users=60, seed=21, span_s=HOURS * 3600)
    topics = {s: (f"imp-backlog-{s}", f"clk-backlog-{s}", f"samples-backlog-{s}") for s in STARTS}
    for imp_t, clk_t, _ in topics.values():
        produce_raw(kafka_bootstrap, [], [], imp_t, clk_t)  # create the topics
    imp_shipper, click_shipper = raw_producer(kafka_bootstrap), raw_producer(kafka_bootstrap)
    procs: dict[str, Any] = {}

    def start_it(start: str, wait: bool = False) -> None:
        imp_t, clk_t, out_t = topics[start]
        procs[start] = p = start_joiner(tmp_path, kafka_bootstrap, out_t, "--impressions-topic", imp_t, "--clicks-topic",
                                        clk_t, "--group", f"backlog-{start}", "--idle-flush-s", "4", name=start)
        if wait:  # the others start in the background: a pause longer than the idle flush ends a replay
            _wait_assigned(tmp_path / f"{start}.log", p)

    got: dict[str, list[dict[str, Any]]] = {}
    try:
        start_it("before", wait=True)
        for i, (imp_burst, click_burst) in enumerate(_bursts(imps, clicks)):
            if i == BURSTS // 2:
                start_it("during")
            for imp_t, clk_t, _ in topics.values():
                produce_raw(kafka_bootstrap, [], click_burst, imp_t, clk_t, producer=click_shipper)
            time.sleep(0.2)  # the impression shipper a moment behind
            for imp_t, clk_t, _ in topics.values():
                produce_raw(kafka_bootstrap, imp_burst, [], imp_t, clk_t, producer=imp_shipper)
            time.sleep(PAUSE_S)
        start_it("after")
        for start, (_, _, out_t) in topics.items():
            msgs = read_topic(kafka_bootstrap, out_t, len(imps), timeout_s=60, idle_s=2)
            got[start] = decode_samples([m.value() for m in msgs], SPEC).table.to_pylist()
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                p.wait(60)
    expected = batch_samples(SPEC, imps, labels).to_pylist()
    for start in STARTS:
        missing = sorted({r["sample_id"] for r in expected} - {r["sample_id"] for r in got[start]})
        log = (tmp_path / f"{start}.log").read_text()
        assert not missing, (f"joiner started {start}: {len(missing)} of {len(expected)} impressions not joined, e.g. "
                             f"{missing[:3]}; {log[-1500:]}")
        try:
            assert_same_samples(got[start], expected)  # each once, same label and features as the batch path
        except AssertionError as e:
            raise AssertionError(f"joiner started {start}: {e}; {log[-1500:]}") from None
        assert sum(r["label"] for r in got[start]) > 300
