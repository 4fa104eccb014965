"""`slipstream demo`: the whole pipeline once, on the embedded stack, in a folder of its own.

Starts the local stack, generates a small data set (raw logs for N days and the labelled stream
after them), runs the `daily_retrain` DAG once with `airflow dags test`, prints what a person wants
to see (rows per day, the snapshot trained on, samples from Iceberg and from Kafka, the model on
the forward tail and the prequential stream next to its baselines, every AUC with its rows and
95% interval, and the promotion decision) and stops the stack by PID, whatever happened.

The demo keeps its state under `<SLIPSTREAM_HOME>/demo` and starts it afresh each time, so it never
touches a stack the user runs in the main home, and a second run gives the same numbers.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from datetime import date, datetime
from pathlib import Path
from typing import Any

from slipstream.dev import datagen, stack
from slipstream.dev.datagen import GeneratedData, GeneratorConfig, generate, write_manifest
from slipstream.dev.joiner_wait import DEADLINE_S, STALL_S, JoinerOutcome
from slipstream.errors import SlipstreamError
from slipstream.pipeline.run_metrics import SET_TITLES, EvalSet, Evaluation, read_run_metrics
from slipstream.processes import stop_process
from slipstream.samples.spec import Spec, load_spec
from slipstream.settings import Settings

log = logging.getLogger(__name__)

DAG_ID = "daily_retrain"


@dataclasses.dataclass(frozen=True)
class DemoOptions:
    start_day: date = date(2026, 11, 1)
    days: int = 3
    impressions_per_day: int = 20_000
    stream_minutes: float = 360.0
    drift: bool = True
    seed: int = 7
    epochs: int = 4
    batch_size: int | None = None
    lr: float | None = None
    """Training knobs of the run (None: the DAG's defaults, `docs/params.md`)."""
    spec: str | None = None
    """The feature spec (a shipped name or a YAML path; None: SLIPSTREAM_SPEC). The synthetic spec
    has its own generator (with drift); any other gets `slipstream.dev.specgen`'s, stationary."""
    keep_running: bool = False
    """Leave the stack up after the run (to look around with `slipstream stack status`)."""
    profile: str = "local"
    """The local stack's profile: `cluster` runs on a Spark cluster, the REST catalog and S3."""


def demo_settings(base: Settings) -> Settings:
    """The demo's own home under the user's, with a broker port nobody else holds."""
    home = base.home / "demo"
    port = stack.free_port()
    return dataclasses.replace(
        base, home=home, warehouse="", raw_dir="", raw_root="", cache_dir="", runs_dir="", registry="", registry_root="",
        specs_dir="",
        kafka_port=port, kafka_bootstrap=f"127.0.0.1:{port}",
    )


def child_env(settings: Settings) -> dict[str, str]:
    """Environment for `airflow` and everything it launches: settings + AIRFLOW_HOME + import paths."""
    env = dict(os.environ)
    env.update(settings.as_env())
    env.update(stack.airflow_env(settings))
    paths = [str(stack.REPO_ROOT), str(stack.REPO_ROOT / "plugins")]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    return env


def run_dag(settings: Settings, logical_day: str, conf: dict[str, Any], log_path: Path) -> None:
    """`airflow dags test` the daily DAG, streaming its output to the console and to `log_path`."""
    airflow = Path(sys.executable).with_name("airflow")
    argv = [str(airflow) if airflow.exists() else "airflow", "dags", "test", DAG_ID, logical_day,
            "--conf", json.dumps(conf)]
    log.info("running %s (log: %s)", " ".join(argv[:5]), log_path)
    started = time.monotonic()
    with open(log_path, "wb") as out:
        proc = subprocess.Popen(argv, env=child_env(settings), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True)
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                out.write(line)
                text = line.decode(errors="replace").rstrip()
                if _worth_showing(text):
                    # stderr: stdout carries only the summary (`--json` output stays parseable)
                    print(f"  | {text[:200]}", file=sys.stderr, flush=True)
            rc = proc.wait()
        except BaseException:
            stop_process(proc.pid)
            raise
    if rc != 0:
        raise SlipstreamError(
            f"`airflow dags test {DAG_ID} {logical_day}` failed with exit code {rc} after "
            f"{time.monotonic() - started:.0f} s; the full log is {log_path}"
        )
    # `dags test` exits 0 even when a task failed in some Airflow versions: check the run state.
    tail = log_path.read_text(errors="replace")[-20_000:]
    if "state=failed" in tail.replace(" ", "") or "DagRunState.FAILED" in tail:
        raise SlipstreamError(f"the {DAG_ID} run failed; see {log_path}")


def _worth_showing(line: str) -> bool:
    keys = ("slipstream", "Marking task", "state=", "rows/s", "ETA", "AUC", "auc", "ERROR", "Error")
    return any(k in line for k in keys)


def wait_for_samples(settings: Settings, spec: Spec, joiner: stack.ServiceState, expected: int, *,
                     deadline_s: float = DEADLINE_S, stall_s: float = STALL_S) -> JoinerOutcome:
    """Wait (with a deadline) for the joiner to commit a sample of every replayed impression.
    Fewer: the dead letters and their reasons are logged; impressions neither committed nor
    dead-lettered stop the demo, naming them and the joiner's log."""
    from slipstream.dev.joiner_wait import wait_for_joiner

    assert spec.label_source is not None
    outcome = wait_for_joiner(joiner.address, expected, broker=settings.kafka_bootstrap,
                              dlq_topics=(f"{spec.events.name}.dlq", f"{spec.label_source.name}.dlq"),
                              deadline_s=deadline_s, stall_s=stall_s)
    if outcome.committed >= expected:
        return outcome
    if not outcome.accounted:
        raise SlipstreamError(f"{outcome.explain()}. {expected - outcome.committed - outcome.impressions_dead:,} "
                              f"impressions are neither samples nor dead letters; see the joiner's log {joiner.log}")
    log.warning("%s; training on the %d samples it made (see %s)", outcome.explain(), outcome.committed, joiner.log)
    return outcome


def newest_run(runs_dir: Path) -> Path:
    runs = sorted(runs_dir.glob("*/metrics.json"), key=lambda p: p.stat().st_mtime)
    if not runs:
        raise SlipstreamError(f"the DAG finished but no run wrote metrics.json under {runs_dir}")
    return runs[-1].parent


def rows_per_day(settings: Settings, spec: Spec) -> tuple[int | None, dict[str, int]]:
    """Current snapshot id of `samples` and its row count per UTC day."""
    import pyarrow.compute as pc

    from slipstream.lake.iceberg import get_catalog, samples_table

    table = samples_table(get_catalog(settings), settings.namespace, spec)
    snap = table.current_snapshot()
    if snap is None:
        return None, {}
    days = table.scan(selected_fields=("event_time",)).to_arrow()["event_time"]
    counts = pc.value_counts(pc.strftime(days, format="%Y-%m-%d"))
    out = {str(c["values"]): int(c["counts"]) for c in counts.to_pylist()}
    return snap.snapshot_id, dict(sorted(out.items()))


def generate_data(spec: Spec, opts: DemoOptions, raw_dir: str) -> tuple[GeneratedData, datetime, bool]:
    """The raw zone and the stream of the demo's spec; returns them, T and whether the hidden model
    drifts at T (only the synthetic spec's generator has drift)."""
    if datagen.generates(spec):
        cfg = GeneratorConfig(start_day=opts.start_day, days=opts.days, impressions_per_day=opts.impressions_per_day,
                              stream_minutes=opts.stream_minutes, drift=opts.drift, seed=opts.seed)
        return generate(cfg, raw_dir), cfg.t_handoff, opts.drift
    from slipstream.dev.specgen import SpecGenConfig, generate_spec

    if opts.drift:
        log.info("spec %s: its generator is stationary (drift is the synthetic spec's); the stream after T "
                 "follows the same hidden model", spec.name)
    scfg = SpecGenConfig(start_day=opts.start_day, days=opts.days, events_per_day=opts.impressions_per_day,
                         stream_minutes=opts.stream_minutes, seed=opts.seed)
    return generate_spec(spec, scfg, raw_dir), scfg.t_handoff, False


def run_demo(base: Settings, opts: DemoOptions) -> dict[str, Any]:
    settings = demo_settings(base)
    spec = load_spec(opts.spec or base.spec)
    if opts.spec:  # before the stack comes up: it creates the tables from the spec
        settings = settings.for_dataset(opts.spec)  # its own tables, topics, raw zone and registry
    if settings.home.exists():
        log.info("starting afresh: removing the previous demo's state in %s", settings.home)
        stale = stack.StackState.load(settings.home)
        for svc in stale.services.values():
            stop_process(svc.pid)
        shutil.rmtree(settings.home)
    settings.home.mkdir(parents=True)
    started = time.monotonic()
    try:
        # the synthetic spec's stream goes the way real traffic does: raw impressions and clicks,
        # joined into samples by the joiner; other specs' generators make finished samples only
        with_joiner = datagen.generates(spec)
        joined: JoinerOutcome | None = None
        state = stack.up(settings, profile=opts.profile, joiner=with_joiner)
        settings = dataclasses.replace(stack.effective_settings(settings), kafka_bootstrap=state.services["kafka"].address)
        data, t_handoff, drift = generate_data(spec, opts, settings.raw_dir)
        write_manifest(data, settings.home / "generator" / "manifest.json")  # the trainer scores its truth as "best"
        if with_joiner and data.stream_events is not None:
            from slipstream.dev.raw_stream import produce_raw_stream

            raw = produce_raw_stream(settings.kafka_bootstrap, spec, data.stream_events, settings.topic_partitions,
                                     home=settings.home)
            joined = wait_for_samples(settings, spec, state.services["joiner"], data.stream.num_rows)
            produced = joined.committed
            log.info("the joiner made %d samples of %s raw events", produced, raw)
        else:
            from slipstream.stream.kafka import produce_samples

            produced = produce_samples(settings.kafka_bootstrap, settings.topic, data.stream,
                                       codec=settings.kafka_codec, spec=spec)
        # A manual run at T covers the last complete day before it: the generator's last day, so
        # the window is exactly the generated days and the handoff is the start of the stream.
        conf: dict[str, Any] = {"window_days": opts.days, "epochs": opts.epochs, "stream_stop": "caught_up"}
        conf.update({k: v for k, v in (("batch_size", opts.batch_size), ("lr", opts.lr)) if v is not None})
        run_dag(settings, t_handoff.date().isoformat(), conf, settings.home / "daily_retrain.log")
        run_dir = newest_run(Path(settings.runs_dir))
        metrics = read_run_metrics(run_dir)
        # what the DAG's publish and report tasks decided lives in the run summary
        from slipstream.pipeline.runlayout import SUMMARY_FILE, read_summary

        run_summary = read_summary(run_dir) if (run_dir / SUMMARY_FILE).exists() else {}
        snapshot_id, per_day = rows_per_day(settings, spec)
        summary = {
            "spec": spec.name,
            "drift": drift,
            "rows_per_day": per_day,
            "snapshot_id": metrics.snapshot_id if metrics.snapshot_id is not None else snapshot_id,
            "produced_to_kafka": produced,
            "joiner": ({"committed": joined.committed, "dead_letters": joined.dead_letters, "reasons": joined.reasons}
                       if joined is not None else None),
            "samples_iceberg": metrics.samples_iceberg,
            "samples_kafka": metrics.samples_kafka,
            "forward_tail_stream": metrics.forward_tail_stream,
            "auc": metrics.auc,
            "auc_on": metrics.auc_on,
            "evaluation": metrics.evaluation.model_dump(mode="json", exclude={"prequential_windows", "prequential_progress"}),
            "prequential_windows": [{"start": w.start.isoformat(), "rows": w.scores.rows,
                                     "model": w.scores.model.model_dump() if w.scores.model else None,
                                     "baseline": w.scores.baseline.model_dump() if w.scores.baseline else None,
                                     "batch_only": w.scores.batch_only.model_dump() if w.scores.batch_only else None}
                                    for w in metrics.evaluation.prequential_windows],
            "prequential_progress": [{"steps": f"{p.first_step}-{p.last_step}", "rows": p.scores.rows,
                                      "model": p.scores.model.model_dump() if p.scores.model else None,
                                      "baseline": p.scores.baseline.model_dump() if p.scores.baseline else None,
                                      "batch_only": p.scores.batch_only.model_dump() if p.scores.batch_only else None}
                                     for p in metrics.evaluation.prequential_progress],
            "forward_tail_start": metrics.forward_tail_start.isoformat() if metrics.forward_tail_start else None,
            "chosen_epoch": metrics.chosen_epoch,
            "epochs_run": metrics.epochs_run,
            "quality_passed": (run_summary.get("quality") or {}).get("passed"),
            "warmup_files": (run_summary.get("warmup") or {}).get("planned_files"),
            "cache_hit_ratio": (metrics.cache or {}).get("hit_ratio"),
            "checkpoint": metrics.checkpoint,
            "metrics": str(run_dir / "metrics.json"),
            "report": (run_summary.get("report") or {}).get("html"),
            "publish": run_summary.get("publish"),
            "profile": opts.profile,
            "catalog": settings.catalog_uri or settings.catalog,
            "warehouse": settings.warehouse,
            "spark_master": (state.services["spark-master"].address if "spark-master" in state.services else "local[*]"),
            "seconds": round(time.monotonic() - started, 1),
            "home": str(settings.home),
        }
        return summary
    finally:
        if opts.keep_running:
            log.info("stack left running; stop it with SLIPSTREAM_HOME=%s slipstream stack down", settings.home)
        else:
            stopped = stack.down(settings)
            log.info("stopped %s", ", ".join(stopped) or "nothing")


def format_summary(s: dict[str, Any]) -> str:
    lines = ["", "Slipstream demo — daily_retrain ran end to end", ""]
    if "spec" in s:
        lines.append(f"feature spec:            {s['spec']} ({'the click model drifts at T' if s.get('drift') else 'no drift'})")
    lines.append("rows written per day (Iceberg `samples`):")
    lines += [f"  {day}  {n:>9,d}" for day, n in s["rows_per_day"].items()]
    lines.append(f"snapshot trained on:     {s['snapshot_id']}")
    lines.append(f"samples from Iceberg:    {s['samples_iceberg']:,}" if s["samples_iceberg"] is not None
                 else "samples from Iceberg:    n/a")
    lines.append(f"samples from Kafka:      {s['samples_kafka']:,} trained (of {s['produced_to_kafka']:,} produced; "
                 f"{s.get('forward_tail_stream') or 0:,} held for the forward tail)"
                 if s["samples_kafka"] is not None else "samples from Kafka:      n/a")
    if s.get("joiner") and s["joiner"]["dead_letters"]:
        reasons = ", ".join(f"{k}: {n:,}" for k, n in s["joiner"]["reasons"].items())
        lines.append(f"joiner dead letters:     {s['joiner']['dead_letters']:,} ({reasons})")
    lines += model_lines(Evaluation.model_validate(s.get("evaluation") or {}), s.get("forward_tail_start"))
    if s.get("prequential_progress"):
        lines.append("prequential AUC as the model trained, by training steps (model | logistic baseline | batch-only, "
                     "95% CI; per window of event time: the report):")
        for w in s["prequential_progress"]:
            lines.append(f"  steps {w['steps']:>9}  {w['rows']:>5,} rows  {_auc(w['model'])} | {_auc(w['baseline'])} | "
                         f"{_auc(w['batch_only'])}")
    if s.get("chosen_epoch") is not None:
        lines.append(f"early stopping:          epoch {s['chosen_epoch']} kept of {s.get('epochs_run')} run "
                     "(lowest loss on the validation day)")
    lines.append(f"quality gate:            {'passed' if s.get('quality_passed') else s.get('quality_passed')}")
    lines.append(f"cache warmup:            {s.get('warmup_files')} files; "
                 f"trainer cache hit ratio {_f(s.get('cache_hit_ratio'))}")
    if s.get("publish"):
        p = s["publish"]
        verdict = "promoted" if p.get("promoted") else "registered, not promoted"
        lines.append(f"model registry:          {verdict} ({p.get('reason')}) in {p.get('registry')}")
    lines.append(f"checkpoint:              {s['checkpoint']}")
    lines.append(f"metrics:                 {s['metrics']}")
    if s.get("report"):
        lines.append(f"insight report:          {s['report']}")
    lines.append(f"ran on:                  Spark {s.get('spark_master')}, catalog {s.get('catalog')}, "
                 f"warehouse {s.get('warehouse')} ({s.get('profile')} profile)")
    lines.append(f"took {s['seconds']:.0f} s; state in {s['home']}")
    return "\n".join(lines)


def model_lines(ev: Evaluation, tail_start: str | None) -> list[str]:
    """The model on every evaluation set, each AUC with its 95% interval and rows; the verdict."""
    out = ["AUC on rows no model trained on before scoring them (95% CI, bootstrap over users):"]
    for name in ("forward_tail", "prequential", "holdout_after_t", "validation", "holdout_before_t"):
        e = ev.get(name)
        if e is None or not e.rows:
            continue
        out.append(f"  {SET_TITLES[name]}: {e.rows:,} rows, {e.users:,} users")
        if e.positives in (0, e.rows):
            out.append(f"    only one class ({e.positives:,} clicks): no AUC")
            continue
        out.append(f"    model {_score(e.model)}   logistic baseline {_score(e.baseline)}   "
                   f"model − baseline {_diff(e.vs_baseline)}")
        extra = [f"batch-only {_score(e.batch_only)}" if e.batch_only else "",
                 f"stream lift {_diff(e.vs_batch_only)}" if name == "prequential" and e.vs_batch_only else "",
                 f"item popularity {_score(e.popularity)}" if e.popularity else "", _best(e)]
        if any(extra):
            out.append("    " + "   ".join(x for x in extra if x))
    tail = ev.forward_tail
    if tail is not None and tail.vs_baseline is not None and tail.vs_baseline.lo is not None:
        shown = tail.vs_baseline.lo > 0
        out.append(f"verdict on the forward tail (from {tail_start or '?'}): the model "
                   + ("beats its baseline (the 95% lower bound of model − baseline is above 0)" if shown else
                      "is not shown better than its baseline (the 95% lower bound of model − baseline is not above 0)"))
    return out


def _score(x: Any) -> str:
    return x.text() if x is not None else "n/a"


def _diff(x: Any) -> str:
    return x.text() if x is not None else "n/a"


def _best(e: EvalSet) -> str:
    """The generator's best, only where its interval is narrower than the gap it explains."""
    if e.best is None:
        return ""
    return f"best achievable {e.best.text()}" if e.best_is_informative() else ""


def _auc(score: dict[str, Any] | None) -> str:
    if not score or score.get("auc") is None:
        return "  n/a "
    lo, hi = score.get("lo"), score.get("hi")
    return f"{score['auc']:.3f}" + (f" [{lo:.3f}, {hi:.3f}]" if lo is not None and hi is not None else "")


def _f(x: Any) -> str:
    return f"{x:.4f}" if isinstance(x, (int, float)) else "n/a"
