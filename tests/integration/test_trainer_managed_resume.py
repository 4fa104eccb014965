"""Managed tables across a kill -9: two processes killed in the stream phase, resumed with one,
data parallel and sharded.
Every sample is trained once, and the exported map is exactly the one an independent replay of
the committed audit builds (every step's rows of both ranks, in step order): both ranks admitted
the same ids at the same steps, and the 1-process resume carried on from the 2-process map."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
import torch
import yaml

from slipstream.samples.spec import load_spec, spec_from_dict
from slipstream.stream.kafka import create_topic, produce_samples
from tests.trainer_fixtures import (
    assert_trained_once,
    generated,
    in_stream_with_progress,
    make_samples,
    run_torchrun,
    start_and_kill,
    stream_ids,
    train_config,
    training_ids,
)
from trainers.models.managed import IdRowMap
from trainers.observe.sample_audit import read_audit

pytestmark = pytest.mark.integration

TABLES = {"user_id": {"table": "managed", "rows": 400, "admit_after": 1, "eviction": "lru"},
          "item_id": {"table": "managed", "rows": 120, "eviction": "lfu"}}
"""Fewer rows than the generator's 2,000 users and 400 items: both tables fill up and evict."""


def _managed_spec_file(path: Path) -> Path:
    raw = copy.deepcopy(dict(load_spec("synthetic").raw))
    for name, opts in TABLES.items():
        raw["features"][name].pop("buckets")
        raw["features"][name].update(opts)
    spec_from_dict(raw)  # valid
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def _replayed_maps(audit: pa.Table, samples: pa.Table, spec_path: Path) -> dict[str, IdRowMap]:
    """The maps an independent reader builds from what was committed: each step's audited rows
    (joined to their samples by id), their ids observed in step order."""
    spec = load_spec(spec_path)
    maps = {name: IdRowMap(name, spec.feature(name).managed) for name in TABLES}  # type: ignore[arg-type]
    audit = audit.sort_by("step")
    at = pc.index_in(audit.column("sample_id"), value_set=samples.column("sample_id"))
    assert at.null_count == 0  # every trained row is a sample of the window or the stream
    trained = samples.take(at)
    steps = audit.column("step").to_numpy()
    cuts = np.flatnonzero(np.diff(steps)) + 1
    for lo, hi in zip(np.r_[0, cuts], np.r_[cuts, len(steps)]):
        part = trained.slice(lo, hi - lo)
        now = int(pc.max(pc.cast(part.column("event_time"), pa.int64())).as_py())
        for name, m in maps.items():  # a table's own feature counts (the history only looks it up)
            u, c = np.unique(part.column(name).to_numpy(), return_counts=True)
            m.observe(u, c, now)
    return maps


@pytest.mark.parametrize("sharding", ["none", "auto"])
def test_a_managed_map_survives_kill_and_resume_on_another_world_size(tmp_path: Path, kafka_bootstrap: str, sharding: str,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Data parallel (`none`), and with the tables sharded by TorchRec (`auto`: each rank writes the
    starting values of new ids' rows into the shards it holds)."""
    fx = make_samples(tmp_path, days=1, per_day=2000, row_group_rows=500, stream_minutes=240.0)
    data = generated(tmp_path, fx)
    topic = f"managed-{tmp_path.name}"
    create_topic(kafka_bootstrap, topic, 4)
    half = data.stream.num_rows // 2
    produce_samples(kafka_bootstrap, topic, data.stream.slice(0, half))
    cfg = train_config(fx, run_id="mc", bootstrap=kafka_bootstrap, topic=topic, dlq_topic=topic + ".dlq", window_days=1,
                       data={"batch_size": 64, "stream_shuffle_buffer": 200, "replay_share": 0.0,
                             "stop": {"mode": "duration", "duration_s": 120, "timeout_s": 150}},
                       run={"checkpoint_every_steps": 3, "checkpoint_every_s": 0.3}, model={"sharding": sharding},
                       optim={"table_optimizer": "adagrad", "table_lr": 0.05} if sharding != "none" else {})
    cfg["model"]["buckets"] = {k: v for k, v in cfg["model"]["buckets"].items() if k not in TABLES}  # type: ignore[index]
    cfg_path = tmp_path / "train.json"
    cfg_path.write_text(json.dumps(cfg))
    run_dir = tmp_path / "runs" / "mc"
    # the synthetic data set's spec file with managed tables (the file's name names the data set: its table and topic)
    (tmp_path / "managed").mkdir()
    spec_path = _managed_spec_file(tmp_path / "managed" / "synthetic.yaml")
    monkeypatch.setenv("SLIPSTREAM_SPEC", str(spec_path))  # the trainers' processes inherit it

    start_and_kill(tmp_path, cfg_path, run_dir, in_stream_with_progress)
    produce_samples(kafka_bootstrap, topic, data.stream.slice(half))  # the stream went on meanwhile
    done = run_torchrun(tmp_path, cfg_path, nproc=1, overrides=("data.stop.mode=caught_up",))
    assert done.returncode == 0, done.stderr[-4000:]

    audit = read_audit(run_dir)
    assert_trained_once(audit, "iceberg", training_ids(fx, window_days=1))
    assert_trained_once(audit, "kafka", stream_ids(data.stream, fx.t_handoff))
    samples = pa.concat_tables([fx.all_samples(), data.stream.select(fx.all_samples().column_names)])
    samples = samples.take(np.unique(samples.column("sample_id").to_numpy(zero_copy_only=False), return_index=True)[1])
    replayed = _replayed_maps(audit, samples, spec_path)
    state = torch.load(run_dir / "export" / "model.pt", map_location="cpu", weights_only=True)["state_dict"]
    for name, m in replayed.items():
        exported = state[f"tables.managed.maps.{name}.row_ids"]
        assert torch.equal(exported, m.row_ids), name  # the same id in every row
        assert m.stats()["evicted"] > 0 and m.rows_in_use == m.rows - 1  # full, and it evicted along the way

    summary = json.loads((run_dir / "metrics.json").read_text())
    assert summary["world_size"] == 1
    users = summary["id_tables"]["user_id"]
    assert users["rows"] == 400 and users["rows_in_use"] == 399 and users["admitted"] == 399 + users["evicted"]
    assert users["eval_rows_after_t"] > 0 and 0 <= users["new_at_t_share"] <= 1
    assert users["new_at_t_share_ci"][0] <= users["new_at_t_share"] <= users["new_at_t_share_ci"][1]
