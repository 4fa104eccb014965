"""`slipstream demo --days N` keeps its usual first day while the window ends before yesterday,
and starts earlier when it would not (a day that is not over is refused by daily_retrain)."""

from __future__ import annotations

from datetime import date, timedelta

from slipstream.commands.demo import first_day
from slipstream.dev.demo import DemoOptions


def test_a_short_window_keeps_the_usual_first_day() -> None:
    assert first_day(3, date(2026, 11, 28)) == DemoOptions.start_day == date(2026, 11, 1)


def test_a_long_window_ends_the_day_before_yesterday() -> None:
    today = date(2026, 11, 28)
    start = first_day(206, today)
    last = start + timedelta(days=205)
    assert last == today - timedelta(days=2) and start < DemoOptions.start_day


def test_a_long_stream_ends_before_today() -> None:
    today = date(2026, 11, 28)
    start = first_day(206, today, stream_minutes=14 * 1440)
    stream_end = start + timedelta(days=206 + 14)
    assert stream_end <= today - timedelta(days=1)
    assert first_day(3, today, stream_minutes=360) == DemoOptions.start_day
