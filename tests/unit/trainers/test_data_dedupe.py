"""The stream's sample-id dedupe: a repeated id within the horizon is refused once admitted, the
decision does not depend on how consume calls cut the stream or on a resume, on any world size."""

from __future__ import annotations

import numpy as np
import pytest

from trainers.checkpoint.statefile import decode_state, encode_state
from trainers.data.dedupe import SampleIdDedupe

S = 1_000_000
HORIZON_S = 600


def _stream(n: int = 400, seed: int = 3) -> tuple[np.ndarray, list[str], np.ndarray]:
    """Records of 4 partitions in offset order: event times rising with jitter, ~10% repeated ids
    (some within the horizon, some long after it)."""
    rng = np.random.default_rng(seed)
    parts = rng.integers(0, 4, n)
    times = (np.arange(n) * 5 + rng.integers(0, 60, n)) * S
    ids = [f"s{i}" for i in range(n)]
    for i in rng.choice(np.arange(50, n), n // 10, replace=False).tolist():
        j = int(rng.integers(max(0, i - 300), i))  # an earlier record's id, maybe on another partition
        ids[i], parts[i] = ids[j], parts[j]
    return parts, ids, times


def _admit_in(cuts: list[int], parts: np.ndarray, ids: list[str], times: np.ndarray,
              dedupe: SampleIdDedupe | None = None) -> np.ndarray:
    d = dedupe or SampleIdDedupe(HORIZON_S, 10_000)
    bounds = [0, *cuts, len(ids)]
    return np.concatenate([d.admit(parts[a:b], ids[a:b], times[a:b]) for a, b in zip(bounds[:-1], bounds[1:])])


def test_a_repeated_id_within_the_horizon_is_refused_and_one_after_it_admitted() -> None:
    d = SampleIdDedupe(HORIZON_S, 100)
    parts = np.zeros(5, dtype=np.int64)
    keep = d.admit(parts, ["a", "b", "a", "c", None], np.asarray([0, 10, 20, 30, 40]) * S)  # type: ignore[list-item]
    assert keep.tolist() == [True, True, False, True, True]
    # later, "b" comes again when the partition's newest event is past b's time + horizon: admitted
    keep = d.admit(np.zeros(2, np.int64), ["c", "b"], np.asarray([100, 10 + HORIZON_S + 1]) * S)
    assert keep.tolist() == [False, True] and d.duplicates == 2
    # the same id on another partition is another partition's business (a sample's key picks its partition)
    assert d.admit(np.ones(1, np.int64), ["a"], np.asarray([50]) * S).tolist() == [True]


def test_the_decision_does_not_depend_on_how_the_stream_is_cut() -> None:
    parts, ids, times = _stream()
    whole = _admit_in([], parts, ids, times)
    assert 10 < (~whole).sum() < 40  # some repeats refused, the ones past the horizon admitted
    for cuts in ([1, 2, 3], [100, 101, 250], list(range(7, 400, 13))):
        assert np.array_equal(_admit_in(cuts, parts, ids, times), whole)


@pytest.mark.parametrize("new_world", [1, 2, 3])
def test_a_resume_on_any_world_size_decides_like_a_run_never_stopped(new_world: int) -> None:
    parts, ids, times = _stream(seed=11)
    whole = _admit_in([], parts, ids, times)
    stop = 230
    old_world = 2
    states = []
    for r in range(old_world):  # rank r read partitions r, r + 2
        mine = np.isin(parts[:stop], [r, r + 2])
        d = SampleIdDedupe(HORIZON_S, 10_000)
        d.admit(parts[:stop][mine], [i for i, m in zip(ids[:stop], mine) if m], times[:stop][mine])
        state = d.state_dict()
        assert state is not None
        states.append(decode_state(encode_state(state)[0]))  # through the checkpoint's file
    got = np.ones(len(ids) - stop, dtype=bool)
    for r in range(new_world):
        d = SampleIdDedupe(HORIZON_S, 10_000)
        d.partitions = [p for p in range(4) if p % new_world == r]
        d.load_rank_states(states)
        mine = np.isin(parts[stop:], d.partitions)
        got[mine] = d.admit(parts[stop:][mine], [i for i, m in zip(ids[stop:], mine) if m], times[stop:][mine])
    assert np.array_equal(got, whole[stop:])


def test_a_checkpoint_keeps_only_what_the_horizon_can_still_match() -> None:
    d = SampleIdDedupe(HORIZON_S, 10_000)
    d.admit(np.zeros(3, np.int64), ["old", "mid", "new"], np.asarray([0, 500, 2000]) * S)
    back = SampleIdDedupe(HORIZON_S, 10_000)
    back.load_rank_states([d.state_dict()])
    assert back.state_of(0) == {"new": 2000 * S}


def test_the_cap_forgets_the_oldest_ids_and_counts_them(caplog: pytest.LogCaptureFixture) -> None:
    d = SampleIdDedupe(10**6, 100)
    d.admit(np.zeros(150, np.int64), [f"x{i}" for i in range(150)], np.arange(150) * S)
    assert len(d) <= 100 and d.evicted >= 50
    assert "data.dedupe_max_ids" in caplog.text
    assert d.admit(np.zeros(2, np.int64), ["x149", "x0"], np.asarray([150, 151]) * S).tolist() == [False, True]
