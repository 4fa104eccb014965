"""Two data sets on one stack, operated through the real Airflow REST API v2 (api-server, scheduler
with LocalExecutor, dag-processor and triggerer on 127.0.0.1, Spark preprocessing, torchrun):

- `synthetic` and `ratings` side by side (SLIPSTREAM_SPECS_DIR): each daily run preprocesses into its
  own Iceberg table (read back with an independent pyiceberg `SqlCatalog`), plans its own topics,
  and publishes into its own registry, whose champion is its own;
- the synthetic run, once successful, is cleared through the API and succeeds again: the re-run
  preprocessed the day again (a new snapshot), so its plan changed and it trained a second attempt
  in a folder of its own — plan, checkpoint, metrics and report consistent — beside the untouched
  first one, and the run's report page shows the latest and lists the earlier;
- a trigger with a conf key that is no param is refused with a 400 naming it;
- every socket of the stack and of the training runs is on the loopback interface.

Training uses the stand-in trainer (a real 2-process torchrun job that reports fixed scores, so
promotion does not depend on how well a few thousand rows train); `test_airflow_daily_retrain`
re-runs a day with the real trainer.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import pytest

from slipstream.settings import Settings
from tests.airflow_fixtures import STANDIN_TRAINER, SocketWatch

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(shutil.which("java") is None, reason="Java 17 is needed by the Spark preprocessing"),
]

DAY = date(2025, 1, 1)
T = datetime(2025, 1, 2, tzinfo=UTC)  # the manual runs' logical date: data interval = DAY
CONF = {"window_days": 1, "epochs": 1, "stream_stop": "0", "cpu_processes": 2, "batch_size": 256}
DATASETS = ("ratings", "synthetic")


@pytest.fixture
def two_dataset_stack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Settings, Any]]:
    from slipstream.dev import stack, ui
    from slipstream.dev.stack import free_port
    from slipstream.samples.spec import SPECS_DIR

    specs = tmp_path / "specs"
    specs.mkdir()
    for name in DATASETS:
        shutil.copy(SPECS_DIR / f"{name}.yaml", specs / f"{name}.yaml")
    port = free_port()
    for key, value in {"SLIPSTREAM_HOME": str(tmp_path / "home"), "SLIPSTREAM_KAFKA_PORT": str(port),
                       "SLIPSTREAM_KAFKA_BOOTSTRAP": f"127.0.0.1:{port}", "SLIPSTREAM_SPECS_DIR": str(specs),
                       "SLIPSTREAM_TRAINER_MODULE": STANDIN_TRAINER, "SLIPSTREAM_TOPIC_PARTITIONS": "2",
                       # the scheduler runs the triggered runs only: unpausing a daily DAG would also
                       # schedule its latest interval (today's, without data)
                       "AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE": "False"}.items():
        monkeypatch.setenv(key, value)
    settings = Settings.from_env()
    try:
        info = ui.up(settings, port=free_port(), password="datasets-test-pass")
        yield settings, info
    finally:
        ui.down(settings)
        stack.down(settings)


def _token(info: Any) -> str:
    req = urllib.request.Request(f"{info.url}/auth/token", method="POST",
                                 data=json.dumps({"username": info.username, "password": info.password}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return str(json.loads(resp.read())["access_token"])


def _api(info: Any, token: str, path: str, body: Any = None, method: str | None = None) -> tuple[int, Any]:
    req = urllib.request.Request(f"{info.url}{path}", method=method or ("POST" if body is not None else "GET"),
                                 data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            text = resp.read().decode()
            return resp.status, json.loads(text) if text.startswith(("{", "[")) else text
    except urllib.error.HTTPError as e:
        text = e.read().decode()
        return e.code, json.loads(text) if text.startswith("{") else text


def _wait(what: str, fn: Any, timeout_s: float, every_s: float = 2.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            value = fn()
            if value:
                return value
        except (OSError, KeyError):  # the server is still coming up
            pass
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")


def _generate(settings: Settings) -> dict[str, int]:
    """One raw day per data set in its own raw zone, and its stream on its own topic; the rows
    preprocessing must commit for DAY, per data set."""
    from slipstream.dev.datagen import GeneratorConfig, generate, reference_samples
    from slipstream.dev.specgen import SpecGenConfig, generate_spec
    from slipstream.samples.spec import load_spec
    from slipstream.stream.kafka import produce_samples

    synthetic, ratings = settings.for_dataset(f"{settings.specs_dir}/synthetic.yaml"), \
        settings.for_dataset(f"{settings.specs_dir}/ratings.yaml")
    cfg = GeneratorConfig(start_day=DAY, days=1, impressions_per_day=2000, users=200, items=60, stream_minutes=10)
    data = generate(cfg, synthetic.raw_dir)
    produce_samples(synthetic.kafka_bootstrap, synthetic.topic, data.stream)
    spec = load_spec("ratings")
    rdata = generate_spec(spec, SpecGenConfig(start_day=DAY, days=1, events_per_day=2000, users=200, items=60,
                                              stream_minutes=10), ratings.raw_dir)
    produce_samples(ratings.kafka_bootstrap, ratings.topic, rdata.stream, spec=spec)
    return {"synthetic": reference_samples(cfg)[str(DAY)].num_rows, "ratings": rdata.batch[str(DAY)].num_rows}


def _run_state(info: Any, token: str, dag_id: str, run_id: str) -> str | None:
    status, run = _api(info, token, f"/api/v2/dags/{dag_id}/dagRuns/{urllib.parse.quote(run_id, safe='')}")
    return run["state"] if status == 200 and run["state"] in ("success", "failed") else None


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_two_data_sets_and_a_cleared_run_on_one_stack(two_dataset_stack: tuple[Settings, Any]) -> None:
    from slipstream.dev.stack import StackState
    from slipstream.pipeline.runlayout import make_run_id
    from slipstream.stream.kafka import client_config

    settings, info = two_dataset_stack
    home = settings.home

    def roots() -> list[int]:  # every server of the stack: the broker and the four Airflow components
        return [svc.pid for svc in StackState.load(home).services.values()]
    started = time.monotonic()
    expected_rows = _generate(settings)
    print(f"[{time.monotonic() - started:.0f}s] data generated", flush=True)
    token = _token(info)
    dags = {ds: f"daily_retrain__{ds}" for ds in DATASETS}
    for dag_id in dags.values():
        _wait(f"the dag-processor to publish {dag_id}", lambda d=dag_id: _api(info, token, f"/api/v2/dags/{d}")[0] == 200, 180)

    # a key that is no param is refused at trigger time, naming it, its near miss and the valid names
    status, body = _api(info, token, f"/api/v2/dags/{dags['synthetic']}/dagRuns",
                        {"logical_date": T.isoformat(), "conf": {**CONF, "learning_rate": 0.1}})
    assert status == 400, body
    assert "'learning_rate': did you mean 'lr'?" in body["detail"] and "window_days" in body["detail"], body
    assert _api(info, token, f"/api/v2/dags/{dags['synthetic']}/dagRuns")[1]["total_entries"] == 0

    with SocketWatch(roots) as watch:
        run_ids = {}
        for ds, dag_id in dags.items():
            status, run = _api(info, token, f"/api/v2/dags/{dag_id}/dagRuns", {"logical_date": T.isoformat(), "conf": CONF})
            assert status == 200, run
            run_ids[ds] = run["dag_run_id"]
            _api(info, token, f"/api/v2/dags/{dag_id}", {"is_paused": False}, "PATCH")
        for ds, dag_id in dags.items():
            state = _wait(f"{dag_id} to finish", lambda d=dag_id, r=run_ids[ds]: _run_state(info, token, d, r), 600, every_s=3)
            assert state == "success", _task_states(info, token, dag_id, run_ids[ds])
            print(f"[{time.monotonic() - started:.0f}s] {dag_id} succeeded", flush=True)

        runs = Path(settings.runs_dir)
        base = make_run_id("daily-synthetic", T, run_ids["synthetic"])
        first = runs / base
        first_files = {name: _digest(first / name) for name in ("plan.json", "metrics.json", "report.html")}

        # Clear the whole finished run through the API: it runs again, preprocessing the day again
        status, cleared = _api(info, token, f"/api/v2/dags/{dags['synthetic']}/dagRuns/"
                                            f"{urllib.parse.quote(run_ids['synthetic'], safe='')}/clear", {"dry_run": False})
        assert status == 200, cleared
        _wait("the cleared run to start", lambda: _run_state(info, token, dags["synthetic"], run_ids["synthetic"]) is None, 60, 1)
        state = _wait("the cleared run to finish",
                      lambda: _run_state(info, token, dags["synthetic"], run_ids["synthetic"]), 600, 3)
        assert state == "success", _task_states(info, token, dags["synthetic"], run_ids["synthetic"])
        print(f"[{time.monotonic() - started:.0f}s] the cleared run succeeded", flush=True)

    # --- the cleared run: two consistent attempts, the first untouched ---------------------------
    second = runs / f"{base}-a2"
    assert sorted(p.name for p in runs.glob(f"{base}*")) == [base, f"{base}-a2"]
    assert {name: _digest(first / name) for name in first_files} == first_files
    for attempt, folder in ((1, first), (2, second)):
        plan, metrics = json.loads((folder / "plan.json").read_text()), json.loads((folder / "metrics.json").read_text())
        summary, info_file = json.loads((folder / "summary.json").read_text()), json.loads((folder / "run.json").read_text())
        assert plan["run_id"] == metrics["run_id"] == folder.name and info_file["attempt"] == attempt
        assert metrics["snapshot_id"] == plan["snapshot_id"] == summary["train"]["snapshot_id"]  # trained on its own plan
        assert (folder / "checkpoint" / "latest").is_file() and (folder / "report.html").is_file()
        assert summary["publish"]["challenger_run_id"] == folder.name
    plans = [json.loads((f / "plan.json").read_text()) for f in (first, second)]
    assert plans[1]["snapshot_id"] != plans[0]["snapshot_id"]
    assert json.loads((second / "run.json").read_text())["reason"].startswith("the plan changed since attempt 1: ")
    quoted = urllib.parse.quote(run_ids["synthetic"], safe="")
    page = _page(info, token, f"/slipstream/dag_runs/{dags['synthetic']}/{quoted}/report")
    latest, earlier = page.split("Earlier attempts")
    assert "<b>Attempt 2</b>" in latest and f"/runs/{second.name}/report.html" in latest
    assert f"/runs/{first.name}/report.html" in earlier and "superseded by attempt 2" in earlier

    # --- the two data sets: their own tables, topics, registries and champions ------------------
    from pyiceberg.catalog.sql import SqlCatalog

    # pyiceberg's own SQL catalog on the catalog database (the name `local` is part of its rows' key)
    reader = SqlCatalog("local", uri=f"sqlite:///{home / 'catalog.db'}", warehouse=settings.warehouse)
    from slipstream.samples.spec import load_spec

    columns = {ds: {f.name for f in load_spec(ds).features} for ds in DATASETS}
    for ds in DATASETS:
        data = settings.for_dataset(f"{settings.specs_dir}/{ds}.yaml")
        table = reader.load_table(f"slipstream_{ds}.samples")
        assert table.properties["slipstream.dataset"] == ds
        have = {f.name for f in table.schema().fields}
        other = columns[next(o for o in DATASETS if o != ds)] - columns[ds]
        assert columns[ds] <= have and not have & other, (ds, sorted(have))
        folder = runs / make_run_id(f"daily-{ds}", T, run_ids[ds])
        if ds == "synthetic":
            folder = second
        plan = json.loads((folder / "plan.json").read_text())
        assert plan["table"] == f"slipstream_{ds}.samples"
        assert (plan["topic"], plan["dlq_topic"]) == (f"{ds}.samples", f"{ds}.samples.dlq")
        rows = table.scan(snapshot_id=plan["snapshot_id"]).to_arrow()
        assert rows.num_rows == plan["rows"] == expected_rows[ds], ds
        config = json.loads((folder / "config.json").read_text())  # what the trainer was told
        assert config["data.dlq_topic"] == f"{ds}.samples.dlq"
        champion = json.loads((Path(data.registry) / "champion.json").read_text())
        first_of_ds = first if ds == "synthetic" else folder
        assert champion["run_id"] == first_of_ds.name, (ds, champion)  # its own first model
        packages = sorted(p.name for p in (Path(data.registry) / "models").iterdir())
        assert packages == sorted({first_of_ds.name, folder.name}), packages
    from confluent_kafka.admin import AdminClient

    topics = set(AdminClient(client_config(settings.kafka_bootstrap)).list_topics(timeout=10).topics)
    assert {f"{ds}.samples{s}" for ds in DATASETS for s in ("", ".dlq")} <= topics

    # --- nothing listened or connected off the loopback interface -------------------------------
    assert len(watch.pids) > 10, watch.pids  # the stack, its task processes, Spark and torchrun were seen
    assert watch.off_loopback() == [], "\n".join(watch.off_loopback())


def _page(info: Any, token: str, path: str) -> str:
    req = urllib.request.Request(f"{info.url}{path}", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.status == 200
        return str(resp.read().decode())


def _task_states(info: Any, token: str, dag_id: str, run_id: str) -> list[tuple[str, str]]:
    _, body = _api(info, token, f"/api/v2/dags/{dag_id}/dagRuns/{urllib.parse.quote(run_id, safe='')}/taskInstances")
    return [(t["task_id"], t["state"]) for t in body.get("task_instances", [])] if isinstance(body, dict) else body
