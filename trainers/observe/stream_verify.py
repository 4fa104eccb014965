"""The stream phase's gate before export: was every committed record trained, held out or rejected?

A fresh reader of its own (`slipstream.stream.committed_count`, started before the range, reading
through aborted transactions) counts what was *committed* in [handoff offsets, stop offsets) of
every partition, and the per-sample audit (`trainers.observe.sample_audit`) says what the run
trained and what it dead-lettered or refused as a duplicate. A committed record with event_time
>= T below the run's final position that is none of these is lost: the run stops naming the
partitions and offsets, before anything is exported. Records at or after the final position were
committed after the reader's last look, or left by a stop that was not "caught up": they are the
lag at the stop, counted from committed records (`kafka_lag_at_stop`), not a loss. A range that
cannot be counted stops the run as well: "0 lost" is never said without the count.
"""

from __future__ import annotations

import logging
from datetime import datetime
from pathlib import Path
from typing import Any

from slipstream.errors import StreamDataLost, StreamReadError
from slipstream.quality.audit import audit_stream, read_kafka_range
from slipstream.samples.spec import Spec
from slipstream.stream.kafka import Broker
from trainers.observe.sample_audit import read_audit

log = logging.getLogger(__name__)

COUNT_TIMEOUT_S = 600.0


def verify_stream(run_dir: Path, broker: Broker, topic: str, spec: Spec, t_handoff: datetime,
                  handoff: dict[int, int] | None, final: dict[int, int], stop: dict[int, int] | None,
                  timeout_s: float = COUNT_TIMEOUT_S, forward_tail_start: datetime | None = None) -> dict[str, Any]:
    """What metrics.json records of the check (`stop_offsets`, `kafka_lag_at_stop`,
    `stream_committed`); raises StreamDataLost naming lost records, or StreamReadError when the
    committed records of the range cannot be counted. {} when the run had no stream phase.
    Records with event time at or after `forward_tail_start` are the forward tail: scored at the
    end, never trained, so not expected in training."""
    if handoff is None:
        return {}
    ends = {p: max(int((stop or {}).get(p, final.get(p, o))), int(final.get(p, o))) for p, o in handoff.items()}
    try:
        kafka = read_kafka_range(broker, topic, handoff, ends, timeout_s=timeout_s, spec=spec)
    except StreamReadError as e:
        raise StreamReadError(f"the stream audit could not count the committed records of {topic} in "
                              f"{_ranges(handoff, ends)}, so it cannot say that none was lost; the model is not "
                              f"exported. {e}. Once the broker serves them, run the trainer again with the same "
                              "run.run_id: it checks again without training anything twice") from e
    metrics = {"t_handoff": t_handoff.isoformat(), "final_offsets": {str(p): o for p, o in final.items()},
               "stop_offsets": {str(p): o for p, o in ends.items()}, "kafka_lag_at_stop": None,
               "forward_tail_start": forward_tail_start.isoformat() if forward_tail_start is not None else None}
    result, notes, lag = audit_stream(read_audit(run_dir), kafka, metrics)
    for note in notes:
        log.info("stream audit: %s", note)
    if result.lost:
        raise StreamDataLost(
            f"{result.lost:,} committed records of {topic} with event_time >= T were neither trained, held out nor "
            f"rejected: {'; '.join(result.lost_where)} (counted by a fresh reader in {_ranges(handoff, ends)}); the "
            f"model is not exported. Examples of their sample ids: {', '.join(map(str, result.lost_examples[:3]))}. "
            f"Start a new run.run_id to train them; keep {run_dir} (its audit/ names every trained record) to report it")
    if result.duplicated:
        log.warning("stream audit: %d sample ids trained more than once (e.g. %s) beyond the dedupe horizon",
                    result.duplicated, ", ".join(map(str, result.duplicated_examples[:3])))
    log.info("stream audit: %d committed records in %s; none lost; %d committed after the final position (the lag "
             "at the stop)", kafka.num_rows, _ranges(handoff, ends), sum(lag.values()))
    return {"stop_offsets": {str(p): o for p, o in sorted(ends.items())}, "kafka_lag_at_stop": sum(lag.values()),
            "stream_committed": kafka.num_rows, "stream_verified": True}


def _ranges(start: dict[int, int], end: dict[int, int]) -> str:
    return ", ".join(f"partition {p} offsets {a}..{end[p] - 1}" if end[p] > a else f"partition {p} (empty)"
                     for p, a in sorted(start.items()))
