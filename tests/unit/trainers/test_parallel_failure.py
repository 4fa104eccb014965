"""A failed distributed run names its cause once: the rank that failed first records its error in
the run folder, and a rank whose collective broke because of it says "stopped because rank N
failed" instead of the process group's own error."""

from __future__ import annotations

from pathlib import Path

import pytest

from slipstream.errors import PeerFailed, StreamDataLost
from trainers.parallel.failure import forget_earlier, settle


@pytest.fixture
def launch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "abc")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    monkeypatch.setattr("trainers.parallel.failure.PEER_WAIT_S", 0.3)


def test_the_other_ranks_name_the_rank_that_failed_first(tmp_path: Path, launch: None) -> None:
    cause = StreamDataLost("Kafka partition s[1] on 127.0.0.1:9 lost records this run already read:\n next offset 40")
    assert settle(cause, tmp_path, rank=1, world=3) is None  # recorded: it is the cause
    broken = RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:1")
    peer = settle(broken, tmp_path, rank=0, world=3)
    assert isinstance(peer, PeerFailed)
    assert str(peer) == ("stopped because rank 1 failed: Kafka partition s[1] on 127.0.0.1:9 lost records this run "
                         "already read: next offset 40")
    # a second failure of its own does not replace the first one's record
    assert settle(ValueError("later"), tmp_path, rank=2, world=3) is None
    assert "rank 1 failed" in str(settle(broken, tmp_path, rank=2, world=3))


def test_a_broken_collective_with_no_record_keeps_its_own_error(tmp_path: Path, launch: None,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    broken = RuntimeError("gloo: Connection reset by peer")
    assert settle(broken, tmp_path, rank=0, world=2) is None  # nobody recorded a cause (a kill -9): its own error stays
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")  # the next launch of the same run
    assert settle(ValueError("boom"), tmp_path, rank=1, world=2) is None
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "2")
    assert settle(broken, tmp_path, rank=0, world=2) is None  # an earlier launch's failure is not this one's
    forget_earlier(tmp_path)
    assert list((tmp_path / "failures").iterdir()) == []


def test_a_world_of_one_records_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    assert settle(ValueError("x"), tmp_path, rank=0, world=1) is None
    assert not (tmp_path / "failures").exists()
