"""When an input partition of a joiner task stops holding the task's watermark back.

A task's watermark follows the slowest of its inputs that still have records to read. An input
that has nothing to read must not hold it back forever (a partition without clicks for a while),
but "nothing arrived for a moment" is not "nothing to read": a backlog replayed on both inputs
reaches the joiner in whatever order the client fetches it, and an input whose records come a
consume round later would otherwise let the other input's newest time (hours ahead) close every
window. So, like Flink's per-partition watermarks with idleness but decided by end offsets, an
input is idle only when all of these hold:

- it is at its end (the client said so: end of partition) for `idle_s`;
- no other input of the task resumed after a pause within `idle_s` (at the start of a burst the
  other input's records may be a moment behind);
- a fresh look at its end offset, taken after the other inputs' newest records arrived, finds its
  position at the end (records to read make it hold again at once).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

Input = tuple[str, int]
"""(topic, partition)."""
EndLook = Callable[[Input], bool | None]
"""A fresh look at an input's end offset: True when its position is at its end (nothing to
read), False when there are records to read, None when the broker did not answer."""
NEVER = -1e18
END_CHECK_S = 0.25
"""How often an input that looks idle has its end offset read again (a broker round trip)."""


@dataclass
class InputActivity:
    idle_s: float
    look: EndLook
    at_end: dict[Input, float] = field(default_factory=dict)
    """Input -> since when it is at its end (no record since the client said so)."""
    received: dict[Input, float] = field(default_factory=dict)
    """Input -> when its newest records arrived."""
    resumed: dict[Input, float] = field(default_factory=dict)
    """Input -> when records arrived after it had been at its end (a burst began)."""
    end_seen: dict[Input, float] = field(default_factory=dict)
    """Input -> when a fresh look at its end offset last found nothing to read."""
    checked: dict[Input, float] = field(default_factory=dict)

    def end(self, tp: Input, now: float) -> None:
        """The client reached the end of `tp`."""
        self.at_end.setdefault(tp, now)

    def records(self, tp: Input, now: float) -> None:
        """Records of `tp` arrived."""
        if self.at_end.pop(tp, None) is not None:
            self.resumed[tp] = now
        self.received[tp] = now

    def idle(self, tp: Input, inputs: list[Input], now: float) -> bool:
        """Whether `tp` no longer holds back the watermark of the task reading `inputs`."""
        since = self.at_end.get(tp)
        if since is None or now - since < self.idle_s:
            return False
        others = [o for o in inputs if o != tp]
        if any(now - self.resumed.get(o, NEVER) < self.idle_s for o in others):
            return False
        newest_other = max((self.received.get(o, NEVER) for o in others), default=NEVER)
        if self.end_seen.get(tp, NEVER) >= max(newest_other, since):
            return True
        if now - self.checked.get(tp, NEVER) < END_CHECK_S:
            return False
        self.checked[tp] = now
        at_end = self.look(tp)
        if at_end is None:
            return False
        if not at_end:
            self.at_end.pop(tp, None)  # records to read: it holds until the client reaches its end again
            return False
        self.end_seen[tp] = now
        return True

    def forget(self, tp: Input) -> None:
        for d in (self.at_end, self.received, self.resumed, self.end_seen, self.checked):
            d.pop(tp, None)
