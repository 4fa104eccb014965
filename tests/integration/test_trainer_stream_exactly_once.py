"""The stream phase never loses a committed sample silently, on the embedded broker (noida-db),
whose `read_committed` fetch that starts after an abort marker returns nothing more:

- a transactional producer (the joiner's role) is killed with -9 inside an open transaction while
  a trainer tails its topic; its successor aborts the transaction and commits more: the trainer
  trains every committed sample once (counted by an independent reader);
- a run killed with its checkpointed offset right after an abort marker resumes and trains every
  sample committed after it; a sample id repeated within the dedupe horizon, before and after the
  resume, is trained once and counted as a duplicate;
- a run that did not read committed records (its checkpoint moved past them) fails at the end
  naming the partition and offsets, and exports nothing, instead of reporting "0 lost".
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from slipstream.samples.codec import encode_samples
from slipstream.samples.schema import is_holdout
from slipstream.stream.committed_count import count_committed
from slipstream.stream.kafka import create_topic
from tests.stream_fixtures import TxnLayout, Value, killed_mid_transaction, write_transactions
from tests.trainer_fixtures import (
    REPO,
    SamplesFixture,
    assert_trained_once,
    checkpoint_meta,
    generated,
    kill_run,
    make_samples,
    run_torchrun,
    start_and_kill,
    torchrun_command,
    train_config,
    trainer_env,
)
from trainers.observe.sample_audit import read_audit

pytestmark = pytest.mark.integration


def _stream(tmp_path: Path) -> tuple[SamplesFixture, pa.Table, list[Value]]:
    """A one-day window and ~300 stream samples as (value, timestamp ms) in produce order."""
    fx = make_samples(tmp_path, days=1, per_day=1500, row_group_rows=500, stream_minutes=300.0)
    stream = generated(tmp_path, fx).stream
    values = encode_samples(stream)
    ts_ms = pc.divide(pc.cast(stream.column("event_time"), pa.int64()), 1000).to_pylist()
    return fx, stream, list(zip(values, ts_ms))


def _trainable(stream: pa.Table, fx: SamplesFixture) -> pa.Table:
    t = pa.scalar(fx.t_handoff, stream.column("event_time").type)
    after = stream.filter(pc.greater_equal(stream.column("event_time"), t))
    return after.filter(pa.array(~is_holdout(after.column("sample_id"))))


def _committed_ids(bootstrap: str, topic: str, end: int, fx: SamplesFixture) -> set[str]:
    """What should have trained, counted by a reader of its own from offset 0."""
    counted = count_committed(bootstrap, topic, {0: (0, end)}, decode=True)
    assert counted.samples is not None
    return set(_trainable(counted.samples, fx).column("sample_id").to_pylist())


def _config(tmp_path: Path, fx: SamplesFixture, run_id: str, bootstrap: str, topic: str, stop: dict[str, object]) -> Path:
    cfg = train_config(fx, run_id=run_id, bootstrap=bootstrap, topic=topic, dlq_topic=topic + ".dlq", window_days=1,
                       data={"batch_size": 64, "consume_batch": 50, "stop": stop},
                       run={"checkpoint_every_steps": 5, "checkpoint_every_s": 0.3})
    path = tmp_path / f"{run_id}.json"
    path.write_text(json.dumps(cfg))
    return path


def test_a_producer_killed_mid_transaction_while_the_trainer_tails_loses_nothing(tmp_path: Path, kafka_bootstrap: str) -> None:
    fx, stream, values = _stream(tmp_path)
    topic = "joined-killed"
    expected = _trainable(stream, fx).num_rows
    cfg_path = _config(tmp_path, fx, "tail", kafka_bootstrap, topic,
                       {"mode": "samples", "samples": expected, "timeout_s": 120})
    run_dir = tmp_path / "runs" / "tail"
    log = open(tmp_path / "tail.log", "w")
    proc: subprocess.Popen[bytes] | None = None
    half = len(values) // 2

    def between(stage: str) -> None:
        nonlocal proc
        if stage == "committed":  # the first half is on the topic: the trainer starts and tails it
            proc = subprocess.Popen(torchrun_command(cfg_path, 2), env=trainer_env(tmp_path), cwd=REPO, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
            deadline = time.monotonic() + 180
            while True:
                m = checkpoint_meta(run_dir)
                if m and m["phase"] == "stream" and m["positions"]["0"] >= half:  # type: ignore[index]
                    return
                assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "tail.log").read_text()[-3000:]
                time.sleep(0.05)
        time.sleep(1.5)  # the trainer polls while the transaction is open, then after it was aborted

    try:
        layout = killed_mid_transaction(kafka_bootstrap, topic, values[:half], values[half:],  # type: ignore[arg-type]
                                        doomed=40, between=between)
        assert proc is not None
        rc = proc.wait(240)
    finally:
        if proc is not None and proc.poll() is None:
            kill_run(proc)
        log.close()
    out = (tmp_path / "tail.log").read_text()
    assert rc == 0, out[-4000:]
    assert len(layout.aborted) == 1 and layout.committed_in(layout.aborted[0][1], layout.end)  # committed after the abort
    committed = _committed_ids(kafka_bootstrap, topic, layout.end, fx)
    assert committed == set(_trainable(stream, fx).column("sample_id").to_pylist())
    assert_trained_once(read_audit(run_dir), "kafka", committed)
    summary = json.loads((run_dir / "metrics.json").read_text())
    assert summary["stream_verified"] and summary["samples_kafka"] == len(committed)


def _kill_after_abort(tmp_path: Path, fx: SamplesFixture, topic: str, bootstrap: str, run_id: str,
                      first: list[Value]) -> tuple[Path, Path, TxnLayout]:
    """`first` committed, then an aborted transaction; a 2-rank run tails the topic and is killed
    once its checkpoint stands right after the abort marker (everything read)."""
    layout = write_transactions(bootstrap, topic, [(True, first), (False, [b"aborted-%d" % i for i in range(30)])],
                                txn_id=f"{topic}-joiner")
    after_marker = layout.aborted[0][1] + 1
    assert after_marker == layout.end
    cfg_path = _config(tmp_path, fx, run_id, bootstrap, topic, {"mode": "duration", "duration_s": 600, "timeout_s": 600})
    run_dir = tmp_path / "runs" / run_id
    killed = start_and_kill(tmp_path, cfg_path, run_dir,
                            lambda m: m["phase"] == "stream" and m["positions"]["0"] == after_marker,  # type: ignore[index]
                            timeout_s=180)
    assert killed["positions"]["0"] == after_marker  # type: ignore[index]
    return cfg_path, run_dir, layout


def test_a_resume_right_after_an_abort_marker_trains_what_was_committed_after_it(tmp_path: Path,
                                                                                 kafka_bootstrap: str) -> None:
    fx, stream, values = _stream(tmp_path)
    topic = "resume-after-abort"
    create_topic(kafka_bootstrap, topic, 1)
    trainable = set(_trainable(stream, fx).column("sample_id").to_pylist())
    ids = stream.column("sample_id").to_pylist()
    repeat = [i for i, sid in enumerate(ids) if sid in trainable]
    half = len(values) // 2
    e0, e1 = [i for i in repeat if i < half][-2:]
    l0 = repeat[-1]
    # repeats within the dedupe horizon (event times an hour or so apart): one inside the first part;
    # after the resume, one of the first part's ids and one of the second part's own
    first = values[:half] + [values[e0]]
    second = [values[e1]] + values[half:] + [values[l0]]
    cfg_path, run_dir, layout = _kill_after_abort(tmp_path, fx, topic, kafka_bootstrap, "after-abort", first)
    write_transactions(kafka_bootstrap, topic, [(True, second)], txn_id=f"{topic}-joiner", layout=layout)

    done = run_torchrun(tmp_path, cfg_path, nproc=2, overrides=("data.stop.mode=caught_up", "data.stop.timeout_s=120"))
    assert done.returncode == 0, done.stderr[-4000:]
    committed = _committed_ids(kafka_bootstrap, topic, layout.end, fx)
    assert committed == trainable
    audit = read_audit(run_dir)
    assert_trained_once(audit, "kafka", committed)  # each id once, the repeated ones included
    dupes = audit.filter(pc.equal(audit.column("source"), "duplicate"))
    assert sorted(dupes.column("sample_id").to_pylist()) == sorted(ids[i] for i in (e0, e1, l0))
    summary = json.loads((run_dir / "metrics.json").read_text())
    assert summary["duplicates"] == 3 and summary["stream_verified"] and summary["kafka_lag_at_stop"] == 0


def test_committed_records_a_run_did_not_read_fail_it_by_partition_and_offsets(tmp_path: Path,
                                                                             kafka_bootstrap: str) -> None:
    fx, stream, values = _stream(tmp_path)
    topic = "skipped-records"
    create_topic(kafka_bootstrap, topic, 1)
    half = len(values) // 2
    cfg_path, run_dir, layout = _kill_after_abort(tmp_path, fx, topic, kafka_bootstrap, "skipped", values[:half])
    write_transactions(kafka_bootstrap, topic, [(True, values[half:])], txn_id=f"{topic}-joiner", layout=layout)
    # the checkpoint's position moves past 40 committed records, as a reader that passed them would leave it
    latest = run_dir / "checkpoint" / (run_dir / "checkpoint" / "latest").read_text().strip() / "meta.json"
    meta = json.loads(latest.read_text())
    start = meta["run"]["positions"]["0"]
    meta["run"]["positions"]["0"] = start + 40
    latest.write_text(json.dumps(meta))

    done = run_torchrun(tmp_path, cfg_path, nproc=2, overrides=("data.stop.mode=caught_up", "data.stop.timeout_s=120"))
    assert done.returncode != 0, done.stderr[-4000:]
    mine = [line for line in done.stderr.splitlines() if line.startswith("trainers.train: rank 0:")]
    assert len(mine) == 1, done.stderr[-4000:]
    assert "were neither trained, held out nor rejected" in mine[0] and "the model is not exported" in mine[0]
    named = re.search(r"partition 0 offsets (\d+)\.\.(\d+)", mine[0])
    assert named and start <= int(named.group(1)) <= int(named.group(2)) < start + 40, mine[0]
    assert not (run_dir / "export").exists() and not (run_dir / "metrics.json").exists()
    assert "stream_verify.py" not in done.stderr  # one line, not a traceback through our code
