"""When a joiner input stops holding its task's watermark back: by its end offset, not by a pause."""

from __future__ import annotations

from slipstream.joiner.idleness import END_CHECK_S, InputActivity

IMP, CLK = ("impressions", 0), ("clicks", 0)
TASK = [IMP, CLK]


class Ends:
    """A fake end-offset look: whether each input's position is at its end, and how often asked."""

    def __init__(self) -> None:
        self.at_end = {IMP: True, CLK: True}
        self.looks = 0

    def __call__(self, tp: tuple[str, int]) -> bool | None:
        self.looks += 1
        return self.at_end[tp]


def test_an_input_with_records_to_read_holds_the_watermark_however_long_it_was_at_its_end() -> None:
    """The backlog case: impressions at their end since start, then a burst whose clicks come in
    one consume round and its impressions the next: the clicks alone must not drive the watermark."""
    ends = Ends()
    act = InputActivity(1.0, ends)
    act.end(IMP, 0.0)
    act.end(CLK, 0.0)
    act.records(CLK, 100.0)  # the burst's clicks arrived; its impressions are on the broker, not read yet
    ends.at_end[IMP] = False
    assert not act.idle(IMP, TASK, 100.0)  # the clicks just resumed: their peer gets a moment
    assert not act.idle(IMP, TASK, 101.5)  # past the grace, the end offset shows records to read
    assert ends.looks == 1 and IMP not in act.at_end  # it holds until the client reaches its end again
    assert not act.idle(IMP, TASK, 500.0)


def test_an_input_idle_by_its_end_offset_lets_the_other_drive_the_watermark_and_is_looked_at_again_after_new_records() -> None:
    ends = Ends()
    act = InputActivity(1.0, ends)
    act.records(IMP, 0.0)
    act.records(CLK, 0.0)
    act.end(CLK, 0.5)
    assert not act.idle(CLK, TASK, 1.0)  # at its end for less than idle_s
    assert act.idle(CLK, TASK, 2.0) and ends.looks == 1  # nothing to read: impressions alone drive it
    assert act.idle(CLK, TASK, 2.01) and ends.looks == 1  # no new impressions since the look
    act.records(IMP, 3.0)  # impressions keep flowing (never paused: no grace)
    assert act.idle(CLK, TASK, 3.0) and ends.looks == 2  # the look predated them: looked again
    act.records(IMP, 3.1)
    assert not act.idle(CLK, TASK, 3.1)  # looks are rate-limited: until the next, it holds
    assert act.idle(CLK, TASK, 3.0 + END_CHECK_S) and ends.looks == 3
    ends.at_end[CLK] = None  # type: ignore[assignment]  # the broker does not answer: hold
    act.records(IMP, 4.0)
    assert not act.idle(CLK, TASK, 5.0)


def test_forgotten_inputs_start_afresh() -> None:
    act = InputActivity(1.0, Ends())
    act.end(CLK, 0.0)
    act.forget(CLK)
    assert not act.idle(CLK, TASK, 10.0)
