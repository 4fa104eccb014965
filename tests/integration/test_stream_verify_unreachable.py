"""The stream audit before export never says "0 lost" without a count: a range it cannot read
stops the run, naming the topic, the partitions and their offsets. (No server: it waits out the
clients' timeouts against an address where nothing listens, ~30 s.)"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from slipstream.errors import StreamReadError
from slipstream.samples.schema import DEFAULT_SPEC
from tests.trainer_fixtures import free_port
from trainers.observe.stream_verify import verify_stream

pytestmark = pytest.mark.integration


def test_a_range_that_cannot_be_counted_stops_the_run_naming_it(tmp_path: Path) -> None:
    nobody = f"127.0.0.1:{free_port()}"  # no broker listens there
    with pytest.raises(StreamReadError) as e:
        verify_stream(tmp_path, nobody, "samples", DEFAULT_SPEC, datetime(2026, 11, 4, tzinfo=UTC),
                      handoff={0: 10, 1: 20}, final={0: 50, 1: 60}, stop={0: 55, 1: 60}, timeout_s=1.0)
    msg = str(e.value)
    assert "could not count the committed records of samples in partition 0 offsets 10..54, partition 1 offsets 20..59" in msg
    assert "the model is not exported" in msg and "same run.run_id" in msg


def test_a_run_without_a_stream_phase_has_nothing_to_verify(tmp_path: Path) -> None:
    assert verify_stream(tmp_path, "127.0.0.1:9", "samples", DEFAULT_SPEC, datetime(2026, 11, 4, tzinfo=UTC),
                         handoff=None, final={}, stop=None) == {}
