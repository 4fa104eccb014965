"""Fixtures shared by the trainer's tests: a small samples table and, for integration tests, a
private Kafka broker that a test may stop and restart (the session broker must stay up)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.table import Table

from slipstream.dev.datagen import GeneratorConfig, generate, reference_samples
from slipstream.lake.iceberg import get_catalog, samples_table
from slipstream.settings import Settings

SMALL_BUCKETS = {"user_id": 101, "item_id": 53, "device_hash": 11, "country_hash": 11, "category_hash": 11}
"""Tiny embedding tables for unit tests of the default spec's model (`model.buckets`)."""

REPO = Path(__file__).resolve().parents[1]
START_DAY = date(2026, 11, 1)


@dataclass
class SamplesFixture:
    settings: Settings
    table: Table
    snapshot_id: int
    gen: GeneratorConfig
    days: dict[str, pa.Table]

    @property
    def t_handoff(self) -> datetime:
        return self.gen.t_handoff

    def all_samples(self) -> pa.Table:
        return pa.concat_tables(list(self.days.values()))


def make_samples(home: Path, *, days: int = 2, per_day: int = 3000, row_group_rows: int = 1000, seed: int = 7,
                 drift: bool = False, **gen_kwargs: object) -> SamplesFixture:
    """A `samples` Iceberg table (SQLite catalog under home) filled with the generator's batch days."""
    settings = Settings(home=home)
    cfg = GeneratorConfig(start_day=START_DAY, days=days, impressions_per_day=per_day, seed=seed, drift=drift, **gen_kwargs)  # type: ignore[arg-type]
    ref = reference_samples(cfg)
    table = samples_table(get_catalog(settings), settings.namespace)
    with table.transaction() as tx:
        tx.set_properties(**{"write.parquet.row-group-limit": str(row_group_rows)})
    for day_table in ref.values():
        table.append(day_table)
    table = get_catalog(settings).load_table(settings.table)
    snap = table.current_snapshot()
    assert snap is not None
    return SamplesFixture(settings, table, snap.snapshot_id, cfg, ref)


def generated(home: Path, fixture: SamplesFixture):  # type: ignore[no-untyped-def]
    """The generator's stream (and manifest) for the same config as the fixture's table."""
    from slipstream.dev.datagen import write_manifest

    data = generate(fixture.gen, home / "raw")
    write_manifest(data, home / "generator" / "manifest.json")
    return data


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Broker:
    """A noida-db Kafka broker on 127.0.0.1 that the test owns: start, stop (by PID), restart."""

    def __init__(self, data_dir: Path, port: int | None = None) -> None:
        self.data_dir = data_dir
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        from slipstream.dev.stack import broker_argv

        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log = open(self.data_dir.parent / f"broker-{self.port}.log", "ab")
        self.proc = subprocess.Popen(
            broker_argv(self.port, self.data_dir), stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"noida-db exited with {self.proc.returncode}; see {self.log.name}")
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.1)
        raise RuntimeError(f"noida-db did not listen on {self.port} within 30s")

    def stop(self) -> None:
        from slipstream.dev.stack import stop_process

        if self.proc is not None:
            stop_process(self.proc.pid, timeout_s=10)  # waits for the whole group: the port is free after
            self.proc.wait(10)
        self.proc = None


def training_ids(fx: SamplesFixture, window_days: int | None = None, validation_days: int = 1) -> set[str]:
    """Ids the batch phase must train: the window's samples that are not held out, without the
    validation days before T (the trainer's `data.validation_days`, when the window is longer)."""
    from slipstream.samples.schema import is_holdout

    days = sorted(fx.days)[-(window_days or len(fx.days)):]
    if validation_days and len(days) > validation_days:
        days = days[:-validation_days]
    ids = pa.concat_tables([fx.days[d] for d in days]).column("sample_id")
    return set(pa.array(ids).filter(pa.array(~is_holdout(ids))).to_pylist())


def stream_ids(stream: pa.Table, t_handoff: datetime) -> set[str]:
    """Ids the stream phase must train: event_time >= T and not held out."""
    import pyarrow.compute as pc

    from slipstream.samples.schema import is_holdout

    after = stream.filter(pc.greater_equal(stream.column("event_time"), pa.scalar(t_handoff, pa.timestamp("us", tz="UTC"))))
    ids = after.column("sample_id")
    return set(pa.array(ids).filter(pa.array(~is_holdout(ids))).to_pylist())


def train_config(fx: SamplesFixture, *, run_id: str, bootstrap: str, topic: str, dlq_topic: str,
                 window_days: int = 2, **sections: dict[str, object]) -> dict[str, object]:
    """A small, fast trainer config for the fixture's table and topic (sections override keys)."""
    cfg: dict[str, dict[str, object]] = {
        "data": {"snapshot_id": fx.snapshot_id, "t_handoff": fx.t_handoff.isoformat(), "window_days": window_days, "epochs": 1,
                 "bootstrap": bootstrap, "topic": topic, "dlq_topic": dlq_topic, "batch_size": 128,
                 "shuffle_buffer": 1500, "stream_shuffle_buffer": 64, "replay_share": 0.25,
                 "max_lateness_s": fx.gen.max_lateness_s, "stop": {"mode": "caught_up", "timeout_s": 60},
                 # the tests of the mechanics (exactly once, resume) train the whole stream; the forward
                 # tail (the trainer's default 0.2) has tests of its own (test_trainer_honest_evaluation)
                 "forward_tail_share": 0.0},
        "model": {"buckets": {"user_id": 2003, "item_id": 1009, "device_hash": 101, "country_hash": 101, "category_hash": 101}, "embed_dim": 8,
                  "bottom_mlp": [16], "top_mlp": [16]},
        "run": {"run_id": run_id, "checkpoint_every_steps": 10, "log_every_steps": 5, "tensorboard": True},
    }
    for section, values in sections.items():
        cfg.setdefault(section, {}).update(values)
    # small tests size their batches for both phases at once (the stream phase's buffers and steps)
    cfg["data"].setdefault("stream_batch_size", cfg["data"]["batch_size"])
    return cfg


def torchrun_command(config_path: Path, nproc: int, overrides: tuple[str, ...] = ()) -> list[str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           "-m", "trainers.train", "--config", str(config_path)]
    for o in overrides:
        cmd += ["--set", o]
    return cmd


def trainer_env(home: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"SLIPSTREAM_HOME": str(home), "PYTHONPATH": f"{REPO}{os.pathsep}{env.get('PYTHONPATH', '')}",
                "OMP_NUM_THREADS": "1"})
    return env


def run_torchrun(home: Path, config_path: Path, nproc: int = 2, overrides: tuple[str, ...] = (),
                 timeout_s: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(torchrun_command(config_path, nproc, overrides), env=trainer_env(home), cwd=REPO,
                          capture_output=True, text=True, timeout=timeout_s)


# --- kill -9 and resume ---------------------------------------------------------------------
def checkpoint_meta(run_dir: Path) -> dict[str, object] | None:
    """The latest committed checkpoint's run progress (step, phase, epoch, positions, counters) with
    its world size, or None before the first commit."""
    latest = run_dir / "checkpoint" / "latest"
    try:
        meta = json.loads((run_dir / "checkpoint" / latest.read_text().strip() / "meta.json").read_text())
    except (OSError, ValueError):
        return None
    return {**meta["run"], "world": meta["world"]}


def kill_run(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the torchrun launcher and its workers (they run in sessions of their own)."""
    try:
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
    except OSError:
        children = []
    for pid in children:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except ProcessLookupError:
            pass
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)


def start_and_kill(home: Path, cfg_path: Path, run_dir: Path, when: Callable[[dict[str, object]], bool],
                    timeout_s: float = 120) -> dict[str, object]:
    """Start a 2-rank run and SIGKILL the whole process group once a checkpoint satisfies `when`."""
    log = open(home / "killed-run.log", "w")
    proc = subprocess.Popen(torchrun_command(cfg_path, 2), env=trainer_env(home), cwd=REPO, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            meta = checkpoint_meta(run_dir)
            if meta is not None and when(meta):
                kill_run(proc)
                after = checkpoint_meta(run_dir)  # the run went on while we looked: what it left is what counts
                assert after is not None
                return after
            if proc.poll() is not None:
                raise AssertionError(f"the run ended (rc {proc.returncode}) before it could be killed; see {log.name}")
            time.sleep(0.01)
        raise AssertionError(f"no checkpoint matched within {timeout_s}s; see {log.name}")
    finally:
        if proc.poll() is None:
            kill_run(proc)
        log.close()


def assert_trained_once(audit: pa.Table, source: str, expected: set[str], per_epoch: bool = False) -> None:
    """Every expected sample id of `source` in the audit exactly once (per epoch, if asked)."""
    t = audit.filter(pc.equal(audit.column("source"), source))
    keys = list(zip(t.column("sample_id").to_pylist(), t.column("epoch").to_pylist())) if per_epoch \
        else t.column("sample_id").to_pylist()
    dupes = [k for k, n in Counter(keys).items() if n > 1]
    assert not dupes, f"{source}: trained twice in committed progress: {dupes[:5]}"
    if per_epoch:
        for e in sorted(set(t.column("epoch").to_pylist())):
            got = {k for k, ep in keys if ep == e}
            assert got == expected, f"epoch {e}: lost {len(expected - got)}, unexpected {len(got - expected)}"
    else:
        got = set(keys)
        assert got == expected, f"{source}: lost {len(expected - got)}, unexpected {len(got - expected)}"


def in_stream_with_progress(m: dict[str, object]) -> bool:
    """A checkpoint predicate for `start_and_kill`: in the stream phase, past the handoff offsets."""
    if m["phase"] != "stream" or not m["handoff_offsets"]:
        return False
    pos, start = m["positions"], m["handoff_offsets"]
    return sum(pos.values()) > sum(start.values()) and int(m["counters"]["samples_kafka"]) > 0  # type: ignore[union-attr]
