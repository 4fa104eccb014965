"""How fresh the exported model is: from an event to the first exported model trained on it.

Every fresh row trained is remembered (its event time) until the next export; at an export, the
seconds from each such row's event time to the export are that row's event-to-model latency. A
continuous run (the `stream_train` DAG) exports every `data.stop.export_every_min` and appends one
line per export to `<run_dir>/freshness.jsonl` (latency p50/p99 of the rows the export brought in,
the live model's prequential AUC over the rows scored since the previous export, with its rows and
interval) and puts the newest into the `freshness` section of the run's `summary.json`, where the
Airflow UI's run page shows it. `metrics.json` has the run's totals (`RunMetrics.freshness`).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from slipstream.pipeline.run_metrics import EvalSet, Freshness
from slipstream.pipeline.runlayout import update_summary

log = logging.getLogger(__name__)

MAX_LATENCIES = 200_000
"""Latencies kept for the run's percentiles (a uniform sample past it)."""
FRESHNESS_FILE = "freshness.jsonl"


class FreshnessTracker:
    def __init__(self, run_dir: Path, is_main: bool, seed: int = 0) -> None:
        self.run_dir, self.is_main = run_dir, is_main
        self._pending: list[np.ndarray] = []
        self.latencies_s = np.zeros(0)
        """Rank 0: event-to-export seconds of the rows exported so far (a uniform sample)."""
        self.exports = 0
        self.live: EvalSet | None = None
        self._rng = np.random.default_rng([seed, 97])

    def trained(self, event_us: np.ndarray) -> None:
        """The event times of a step's fresh rows (this rank)."""
        if len(event_us):
            self._pending.append(np.asarray(event_us, dtype=np.int64))

    def collect(self, gather: Callable[[Any], list[Any]]) -> np.ndarray | None:
        """Collective: every rank's event times since the last export (rank 0; None elsewhere)."""
        mine = np.concatenate(self._pending) if self._pending else np.zeros(0, dtype=np.int64)
        self._pending = []
        everything = gather(mine)
        return np.concatenate(everything) if self.is_main else None

    def exported(self, event_us: np.ndarray, at_s: float | None = None, live: EvalSet | None = None,
                 step: int = 0, record: bool = True) -> dict[str, Any]:
        """Rank 0: an export at `at_s` (now) of a model trained on rows with these event times."""
        at_s = time.time() if at_s is None else at_s
        lat = at_s - event_us / 1e6
        self.exports += 1
        self.live = live if live is not None else self.live
        kept = np.concatenate([self.latencies_s, lat])
        if len(kept) > MAX_LATENCIES:
            kept = self._rng.choice(kept, MAX_LATENCIES, replace=False)
        self.latencies_s = kept
        p50, p99 = _pct(lat, 50), _pct(lat, 99)
        line: dict[str, Any] = {"exported_at": datetime.fromtimestamp(at_s, tz=UTC).isoformat(), "step": step,
                "rows": int(len(lat)), "event_to_export_s_p50": p50, "event_to_export_s_p99": p99,
                "newest_event_time": (datetime.fromtimestamp(float(event_us.max()) / 1e6, tz=UTC).isoformat()
                                      if len(event_us) else None),
                "live_prequential": live.model_dump(mode="json") if live is not None else None}
        if record:
            with open(self.run_dir / FRESHNESS_FILE, "a") as f:
                f.write(json.dumps(line) + "\n")
            update_summary(self.run_dir, "freshness", line)
            auc = live.model.text() if live is not None and live.model is not None else "n/a"
            log.info("export %d: event-to-model p50 %s s, p99 %s s over %d rows; live prequential AUC %s on %d rows",
                     self.exports, _fmt(p50), _fmt(p99), len(lat), auc,
                     live.rows if live is not None else 0)
        return line

    def summary(self, consume_to_train_ms: list[float]) -> Freshness:
        return Freshness(exports=self.exports, event_to_export_s_p50=_pct(self.latencies_s, 50),
                         event_to_export_s_p99=_pct(self.latencies_s, 99),
                         consume_to_train_ms_p50=_pct(np.asarray(consume_to_train_ms), 50),
                         consume_to_train_ms_p99=_pct(np.asarray(consume_to_train_ms), 99), live_prequential=self.live)


def _pct(values: np.ndarray, q: float) -> float | None:
    return float(np.percentile(values, q)) if len(values) else None


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1f}"
