"""Checkpoints survive a crash at any point of a save, skip unchanged states, and load without
running code (issue 23, items 1 and 13)."""

from __future__ import annotations

import os
import pickle
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from slipstream.errors import ResumeError
from trainers.checkpoint import store as checkpoint_module
from trainers.checkpoint.statefile import decode_state, encode_state
from trainers.checkpoint.store import Checkpointer


class Crash(BaseException):
    """Stands for a kill -9 at one point of a save (nothing after it runs)."""


def _model(step: int) -> dict[str, Any]:
    return {"model": {"w": torch.full((4, 3), float(step))},
            "optimizer": {"state": {}, "param_groups": [{"lr": 0.1, "betas": (0.9, 0.99)}]},
            "scaler": {}, "step": step}


def _data(tag: int) -> dict[str, Any]:
    rng = np.random.default_rng(tag)
    return {"positions": {0: tag, 3: 2 * tag}, "rng": rng.bit_generator.state,
            "rows": {"label": np.arange(tag, dtype=np.float32)}}


def _meta(step: int, phase: str, t: float = 0.0) -> dict[str, Any]:
    return {"step": step, "phase": phase, "world": 1, "time": t}


def _save(ck: Checkpointer, step: int, phase: str, tag: int, t: float = 0.0) -> Path:
    return ck.save(step, _model(step), _data(tag), _meta(step, phase, t))


def _loaded(root: Path) -> tuple[str, int, dict[str, Any]]:
    """What a resume in a fresh process finds: phase, model weight, data state."""
    ck = Checkpointer(root, rank=0, barrier=lambda: None)
    path = ck.latest()
    assert path is not None
    return ck.load_meta(path)["phase"], int(ck.load_model(path)["model"]["w"][0, 0]), ck.load_data(path, 0)


def _count_calls(root: Path, monkeypatch: pytest.MonkeyPatch) -> int:
    """How many renames and removals a re-save of the committed step makes."""
    calls = []
    real_replace, real_rmtree = os.replace, shutil.rmtree
    monkeypatch.setattr(checkpoint_module.os, "replace", lambda *a, **k: (calls.append(1), real_replace(*a, **k))[1])
    monkeypatch.setattr(checkpoint_module.shutil, "rmtree", lambda *a, **k: (calls.append(1), real_rmtree(*a, **k))[1])
    ck = Checkpointer(root, rank=0, barrier=lambda: None)
    _save(ck, 7, "stream", 2)
    monkeypatch.undo()
    return len(calls)


def test_a_crash_at_any_point_of_a_re_save_leaves_a_complete_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The handoff commits the batch phase's last step again: a kill between any two file-system
    operations of that re-save must leave `latest` naming the old or the new checkpoint, whole."""
    probe = tmp_path / "probe"
    _save(Checkpointer(probe, 0, lambda: None), 7, "batch", 1)
    n_calls = _count_calls(probe, monkeypatch)
    assert n_calls >= 2
    for k in range(n_calls + 1):
        root = tmp_path / f"crash-{k}"
        _save(Checkpointer(root, 0, lambda: None), 7, "batch", 1)
        seen: list[Any] = []

        def crash_at_k(real: Any, k: int = k, seen: list[Any] = seen) -> Any:
            def op(*a: Any, **kw: Any) -> Any:
                seen.append(a)
                if len(seen) == k + 1:
                    raise Crash(f"killed before operation {k}: {a}")
                return real(*a, **kw)
            return op

        monkeypatch.setattr(checkpoint_module.os, "replace", crash_at_k(os.replace))
        monkeypatch.setattr(checkpoint_module.shutil, "rmtree", crash_at_k(shutil.rmtree))
        try:
            _save(Checkpointer(root, 0, lambda: None), 7, "stream", 2)
        except Crash:
            pass
        monkeypatch.undo()
        phase, weight, data = _loaded(root)
        assert weight == 7
        assert (phase, data["positions"]) in (("batch", {0: 1, 3: 2}), ("stream", {0: 2, 3: 4})), f"crash at {k}"
        # and the run goes on from there: the next save commits
        _save(Checkpointer(root, 0, lambda: None), 8, "stream", 3)
        assert _loaded(root)[:2] == ("stream", 8)


def test_an_unchanged_state_is_not_rewritten(tmp_path: Path) -> None:
    root = tmp_path / "checkpoint"
    ck = Checkpointer(root, rank=0, barrier=lambda: None, keep=2)
    first = _save(ck, 5, "stream", 1, t=1.0)
    model_inode = (first / "model.pt").stat().st_ino
    # an idle stream: the same step and data, only the clock moved
    for t in (2.0, 3.0, 4.0):
        assert _save(ck, 5, "stream", 1, t=t) == first
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step-000000005"]
    # rows arrived but no step was taken: new data, the model is linked, not written again
    second = _save(ck, 5, "stream", 2, t=5.0)
    assert second.name == "step-000000005.r1"
    assert (second / "model.pt").stat().st_ino == model_inode
    assert _loaded(root)[2]["positions"] == {0: 2, 3: 4}
    third = _save(ck, 6, "stream", 2, t=6.0)
    assert (third / "model.pt").stat().st_ino != model_inode
    assert (third / "data-rank-0.npz").stat().st_ino == (second / "data-rank-0.npz").stat().st_ino
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step-000000005.r1", "step-000000006"]


def test_latest_naming_an_incomplete_folder_gives_safe_advice(tmp_path: Path) -> None:
    root = tmp_path / "checkpoint"
    ck = Checkpointer(root, rank=0, barrier=lambda: None, keep=3)
    _save(ck, 3, "batch", 1)
    _save(ck, 4, "batch", 2)
    (root / "step-000000004" / "model.pt").unlink()  # what the old remove-then-rename left behind
    with pytest.raises(ResumeError) as e:
        Checkpointer(root, rank=0, barrier=lambda: None).latest()
    msg = str(e.value)
    assert "step-000000004" in msg and "no model.pt" in msg
    assert "echo step-000000003 >" in msg and "Do not delete" in msg


def test_data_state_round_trips_without_pickle(tmp_path: Path) -> None:
    rng = np.random.default_rng([7, 1, 17])
    rng.random(5)
    state = {"iceberg": {"epoch": 2, "chunk": 0, "units_digest": "ab"}, "positions": {0: 10, 2: 99},
             "shuffle": {"rows": {"label": np.ones(3, np.float32), "cats": np.zeros((3, 4), np.int64),
                                  "sample_id": ["a", "b", "c"]}, "rng": rng.bit_generator.state},
             "replay": None, "pair": (1, 2.5), "nan": float("nan")}
    blob, digest = encode_state(state)
    assert encode_state(state)[1] == digest
    back = decode_state(blob)
    assert back["positions"] == {0: 10, 2: 99} and back["pair"] == (1, 2.5)
    np.testing.assert_array_equal(back["shuffle"]["rows"]["cats"], state["shuffle"]["rows"]["cats"])  # type: ignore[index]
    assert back["shuffle"]["rows"]["sample_id"] == ["a", "b", "c"]
    restored = np.random.default_rng(0)
    restored.bit_generator.state = back["shuffle"]["rng"]
    assert restored.random() == rng.random()
    with pytest.raises(TypeError, match="object array"):
        encode_state({"ids": np.array(["a", None], dtype=object)})


class _Payload:
    def __reduce__(self) -> Any:
        return (os.mkdir, (str(Path(os.environ["PAYLOAD_DIR"]) / "ran"),))


def test_files_that_would_run_code_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "checkpoint"
    path = _save(Checkpointer(root, 0, lambda: None), 3, "batch", 1)
    monkeypatch.setenv("PAYLOAD_DIR", str(tmp_path))
    torch.save({"model": _Payload()}, path / "model.pt")
    with pytest.raises(ResumeError, match="could run code"):
        Checkpointer.load_model(path)
    (path / "data-rank-0.npz").write_bytes(pickle.dumps(_Payload()))
    with pytest.raises(ValueError, match="pickled"):
        Checkpointer.load_data(path, 0)
    assert not (tmp_path / "ran").exists()
    # a checkpoint of the old format (pickled data state) is refused with what to do
    (path / "data-rank-0.npz").rename(path / "data-rank-0.pt")
    with pytest.raises(ResumeError, match="new run.run_id"):
        Checkpointer.load_data(path, 0)


def test_a_save_that_did_not_finish_leaves_nothing_once_the_run_starts_again(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "ckpt"
    _save(Checkpointer(root, 0, lambda: None), 3, "batch", 1)
    ck = Checkpointer(root, 0, lambda: None)

    def crash(*a: Any, **k: Any) -> None:
        raise Crash

    monkeypatch.setattr(ck, "_publish", crash)
    with pytest.raises(Crash):
        _save(ck, 4, "batch", 2)  # killed after writing step-4.tmp, before its rename
    monkeypatch.undo()
    (root / "latest.tmp").write_text("step-000000004")  # and a pointer update cut short
    assert (root / "step-000000004.tmp").is_dir()
    Checkpointer(root, 0, lambda: None)  # the next start (rank 0)
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step-000000003"]
    assert _loaded(root)[:2] == ("batch", 3)


def test_a_full_disk_names_the_file_it_could_not_write(tmp_path: Path) -> None:
    from slipstream.errors import RunFolderWriteError
    from trainers.checkpoint.store import atomic_write_text
    from trainers.observe.sample_audit import AuditWriter

    target = tmp_path / "latest"
    (tmp_path / "latest.tmp").symlink_to("/dev/full")  # Linux: every write there fails with ENOSPC
    with pytest.raises(RunFolderWriteError, match=rf"cannot write {tmp_path}/latest.tmp: No space left on device\. "
                                                  rf"Free space on the disk of {tmp_path}"):
        atomic_write_text(target, "step-000000001")
    audit = AuditWriter(tmp_path / "audit", rank=0)
    (tmp_path / "audit" / "parts").mkdir(parents=True)
    part = tmp_path / "audit" / "parts" / "rank-0-step-000000005.parquet.tmp"
    part.symlink_to("/dev/full")
    audit.add_dead_letters([(0, 1, "s1")], step=5)
    with pytest.raises(RunFolderWriteError, match=rf"cannot write {part}: "):
        audit.write_part(5)
