"""A run whose stream phase had nothing to read (the topic empty from the handoff on) is audited
as 0 committed, 0 lost: the committed reader's empty range still has the sample columns."""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
import pyarrow as pa

from slipstream.quality.audit import audit_stream, read_kafka_range
from slipstream.stream.committed_count import count_committed


def test_an_empty_range_reads_no_broker_and_audits_as_nothing_lost() -> None:
    # start == end on every partition: nothing to count, so no broker is asked (none listens here)
    counted = count_committed("127.0.0.1:9", "t", {0: (5, 5), 1: (0, 0)}, decode=True)
    assert counted.total == 0 and counted.samples is not None and counted.samples.num_rows == 0
    assert {"sample_id", "event_time", "partition", "offset"} <= set(counted.samples.schema.names)

    kafka = read_kafka_range("127.0.0.1:9", "t", {0: 5, 1: 0}, {0: 5, 1: 0})
    n = 3
    audit = pa.table({"sample_id": pa.array(["a", "b", "c"]), "source": pa.array(["iceberg"] * n),
                      "epoch": pa.array(np.zeros(n, np.int32)), "partition": pa.array(np.full(n, -1, np.int32)),
                      "offset": pa.array(np.full(n, -1, np.int64)), "step": pa.array(np.arange(n), pa.int64())})
    metrics = {"t_handoff": datetime(2026, 11, 3, tzinfo=UTC).isoformat(), "final_offsets": {"0": 5, "1": 0},
               "kafka_lag_at_stop": 0}
    res, _, lag = audit_stream(audit, kafka, metrics)
    assert (res.expected, res.lost, res.duplicated) == (0, 0, 0) and res.exactly_once and lag == {0: 0, 1: 0}
