"""Model registry: one package per training run, and a champion chosen on the future.

Layout under the registry location (a local folder or `s3://bucket/prefix`):

    models/<run_id>/model.pt, model.json, config.json, metrics.json   copied from the run folder
    models/<run_id>/package.json    lineage + metrics + file checksums + the promotion decision;
                                    written last, so a package without it is incomplete
    champion.json                   {"run_id", "auc", "promoted_at"} of the serving model (and
                                    "manual": the reason, when a person promoted it by hand)

The decision reads the run's metrics.json (`slipstream.pipeline.run_metrics`): the forward tail,
the last part of the stream after T by event time, which neither the challenger, its baselines
nor the champion trained on, with the champion re-scored on the same rows in the same step
(`trainers.eval.judge`). Every run is registered; it is promoted (rule `significant`, the default)
only when it is *shown* better: the lower 95% bound of challenger − its logistic baseline is
above 0, and the lower bound of challenger − champion above −tolerance (retraining on fresher data
is worth a hair of AUC noise; a real regression is not). A first model whose advantage over its
baseline is not significant is registered, not promoted, and the reason says so. The bounds come
from a bootstrap over users. The rule `point` (`SLIPSTREAM_PROMOTION_RULE=point`, for demos on
small data) compares point estimates instead. Without a forward tail (no stream phase) the
validation days decide against the baseline only, and a champion is never replaced on them.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs

from slipstream.env_settings import settings_from_env
from slipstream.errors import ConfigError
from slipstream.pipeline.promotion import RULES, PromotionDecision, decide_promotion
from slipstream.pipeline.run_metrics import RunMetrics, read_run_metrics
from slipstream.pipeline.runlayout import RunArtifactMissing, read_json
from slipstream.settings import Settings

log = logging.getLogger(__name__)

PACKAGE_FILE = "package.json"
CHAMPION_FILE = "champion.json"
DEFAULT_TOLERANCE = 0.002
# run-folder file → package file name
PACKAGE_FILES = {
    "export/model.pt": "model.pt",
    "export/model.json": "model.json",
    "config.json": "config.json",
    "metrics.json": "metrics.json",
}
__all__ = ["ModelRegistry", "PromotionDecision", "RegistryConfig", "decide_promotion"]


@dataclass(frozen=True, kw_only=True)
class RegistryConfig:
    location: str
    """The data set's registry, a folder or s3://bucket/prefix: `Settings.registry` (SLIPSTREAM_REGISTRY,
    or SLIPSTREAM_DATASET__<NAME>__REGISTRY; default <home>/registry/<data set>). One per data set:
    a champion is only ever compared with models of its own data set."""
    tolerance: float = DEFAULT_TOLERANCE
    """SLIPSTREAM_PROMOTION_AUC_TOLERANCE: a challenger may be this much AUC below the champion."""
    rule: str = "significant"
    """SLIPSTREAM_PROMOTION_RULE: `significant` (the 95% lower bounds decide) or `point` (point
    estimates decide: the rule before intervals, for demos on small data)."""

    def __post_init__(self) -> None:
        if not 0 <= self.tolerance < 0.5:
            raise ConfigError(f"SLIPSTREAM_PROMOTION_AUC_TOLERANCE must be in [0, 0.5), got {self.tolerance}")
        if self.rule not in RULES:
            raise ConfigError(f"SLIPSTREAM_PROMOTION_RULE must be one of {', '.join(RULES)}, got {self.rule!r}")

    @classmethod
    def from_env(cls, settings: Settings, env: Mapping[str, str] | None = None) -> RegistryConfig:
        """The registry of `settings`' data set (the location is the settings', never re-read from
        the environment, which names the deployment's default data set's), with the tolerance of `env`."""
        return settings_from_env(cls, env, prefix="SLIPSTREAM_", names=_REGISTRY_ENV,
                                 given={"location": settings.registry})


_REGISTRY_ENV = {"location": "SLIPSTREAM_REGISTRY", "tolerance": "SLIPSTREAM_PROMOTION_AUC_TOLERANCE",
                 "rule": "SLIPSTREAM_PROMOTION_RULE"}


def _s3_filesystem(env: Mapping[str, str]) -> pafs.S3FileSystem:
    endpoint = env.get("SLIPSTREAM_S3_ENDPOINT", "")
    scheme = "http" if endpoint.startswith("http://") else "https"
    return pafs.S3FileSystem(
        access_key=env.get("SLIPSTREAM_S3_ACCESS_KEY_ID") or None,
        secret_key=env.get("SLIPSTREAM_S3_SECRET_ACCESS_KEY") or None,
        region=env.get("SLIPSTREAM_S3_REGION") or "us-east-1",
        endpoint_override=endpoint.split("://", 1)[-1] or None,
        scheme=scheme,
        allow_bucket_creation=True,  # a fresh registry bucket is created on the first publish
    )


class ModelRegistry:
    def __init__(self, location: str, env: Mapping[str, str] | None = None) -> None:
        env = os.environ if env is None else env
        if location.startswith("s3://"):
            self.fs: pafs.FileSystem = _s3_filesystem(env)
            self.root = location.removeprefix("s3://").rstrip("/")
        else:
            self.fs = pafs.LocalFileSystem()
            self.root = str(Path(location.removeprefix("file://")).resolve())
        self.location = location

    def _path(self, *parts: str) -> str:
        return "/".join((self.root, *parts))

    def _read_json(self, path: str) -> dict[str, Any] | None:
        try:
            with self.fs.open_input_stream(path) as f:
                doc: dict[str, Any] = json.loads(f.read())
                return doc
        except FileNotFoundError:
            return None

    def _write_bytes(self, path: str, data: bytes) -> None:
        self.fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
        if isinstance(self.fs, pafs.LocalFileSystem):
            tmp = f"{path}.tmp-{os.getpid()}"
            with self.fs.open_output_stream(tmp) as f:
                f.write(data)
            self.fs.move(tmp, path)  # atomic rename: readers see the old or the new file
        else:
            with self.fs.open_output_stream(path) as f:  # one PUT: atomic on S3
                f.write(data)

    def champion(self) -> dict[str, Any] | None:
        return self._read_json(self._path(CHAMPION_FILE))

    def model_bytes(self, run_id: str) -> bytes:
        """The exported `model.pt` of a published package (to re-score a champion)."""
        with self.fs.open_input_stream(self._path("models", run_id, "model.pt")) as f:
            return bytes(f.read())

    def package(self, run_id: str) -> dict[str, Any] | None:
        return self._read_json(self._path("models", run_id, PACKAGE_FILE))

    def list_packages(self) -> list[dict[str, Any]]:
        selector = pafs.FileSelector(self._path("models"), allow_not_found=True)
        out = []
        for info in self.fs.get_file_info(selector):
            if info.type == pafs.FileType.Directory:
                pkg = self._read_json(f"{info.path}/{PACKAGE_FILE}")
                if pkg is not None:  # no package.json: a publish that did not finish
                    out.append(pkg)
        return sorted(out, key=lambda p: p.get("created_at", ""))

    def promote(self, run_id: str, reason: str) -> dict[str, Any]:
        """Make a published package the champion by hand (a rollback, or an override the rules
        would refuse), with the person's reason; the next run is judged against it."""
        pkg = self.package(run_id)
        if pkg is None:
            raise RunArtifactMissing(f"no package {run_id!r} in {self.location}: publish the run first "
                                     "(`slipstream models list` shows what is there)")
        if not reason.strip():
            raise ConfigError("a manual promotion needs a reason (--reason): it is kept in champion.json")
        champion = {"run_id": run_id, "auc": pkg.get("metrics", {}).get("auc"),
                    "promoted_at": datetime.now(UTC).isoformat(), "manual": reason.strip()}
        self._write_bytes(self._path(CHAMPION_FILE), json.dumps(champion, indent=2).encode())
        log.info("%s promoted by hand in %s: %s", run_id, self.location, reason)
        return champion

    def publish(self, run_path: Path, *, tolerance: float = DEFAULT_TOLERANCE, rule: str = "significant") -> dict[str, Any]:
        """Copy the run's model package in, decide champion/challenger, return package.json."""
        run_id = run_path.name
        metrics = read_run_metrics(run_path)
        files: dict[str, dict[str, Any]] = {}
        for src_rel, name in PACKAGE_FILES.items():
            src = run_path / src_rel
            if not src.exists():
                raise RunArtifactMissing(f"{src} is missing: the trainer did not export run {run_id}; see the training log")
            data = src.read_bytes()
            self._write_bytes(self._path("models", run_id, name), data)
            files[name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        model_meta = read_json(run_path / "export/model.json", "exported model metadata")
        decision = decide_promotion(run_id, metrics, self.champion(), tolerance, rule)
        package = {
            "run_id": run_id,
            "created_at": datetime.now(UTC).isoformat(),
            "schema_version": model_meta.get("schema_version", model_meta.get("SCHEMA_VERSION")),
            "lineage": _lineage(metrics),
            "metrics": _scores(metrics),
            "files": files,
            "decision": decision.to_dict(),
        }
        self._write_bytes(self._path("models", run_id, PACKAGE_FILE), json.dumps(package, indent=2).encode())
        if decision.promoted:
            champion = {"run_id": run_id, "auc": decision.challenger_auc, "promoted_at": package["created_at"]}
            self._write_bytes(self._path(CHAMPION_FILE), json.dumps(champion, indent=2).encode())
        log.info(
            "published %s to %s: %s (%s)",
            run_id, self.location, "PROMOTED" if decision.promoted else "kept champion", decision.reason,
        )
        return package


def _lineage(m: RunMetrics) -> dict[str, Any]:
    """What the package was trained on (from metrics.json)."""
    d = m.to_dict()
    return {k: d[k] for k in ("snapshot_id", "t_handoff", "window_start", "handoff_offsets", "final_offsets",
                              "newest_event_time", "forward_tail_start")}


def _scores(m: RunMetrics) -> dict[str, Any]:
    """The package's scores: the headline with its interval and rows, and the sets that judge it."""
    ev = m.evaluation
    sets = {name: s.model_dump(mode="json") for name in ("forward_tail", "prequential", "validation")
            if (s := ev.get(name)) is not None}
    return {"auc": m.auc, "auc_lo": m.auc_lo, "auc_hi": m.auc_hi, "auc_rows": m.auc_rows, "auc_on": m.auc_on,
            "logloss": m.logloss, "baseline_auc": m.baseline_auc, "chosen_epoch": m.chosen_epoch,
            "samples_iceberg": m.samples_iceberg, "samples_kafka": m.samples_kafka, "sets": sets}
