"""Model registry: one package per training run, and a champion chosen on the future.

Layout under the registry location (a local folder or `s3://bucket/prefix`):

    models/<run_id>/model.pt, model.json, config.json, metrics.json   copied from the run folder
    models/<run_id>/package.json    lineage + metrics + file checksums + the promotion decision;
                                    written last, so a package without it is incomplete
    champion.json                   {"run_id", "auc", "promoted_at"} of the serving model (and
                                    "manual": the reason, when a person promoted it by hand)

The decision reads the run's metrics.json, whose scores the trainer computed on rows after T (the
future: neither the challenger, its baselines nor the champion trained on them), with the champion
re-scored on the same rows in the same step (`trainers.eval.judge`). A challenger is promoted when it
beats its own logistic-regression baseline there, and its AUC is at least the champion's minus a
tolerance (retraining on fresher data is worth a hair of AUC noise; a real regression is not).
The reason names the numbers, the rows and the 95% interval of each difference (a bootstrap over
users), so "better" means better. Without rows after T (no stream phase) the validation days
decide against the baseline only, and a champion is never replaced on them.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs

from slipstream.env_settings import settings_from_env
from slipstream.errors import ConfigError
from slipstream.pipeline.runlayout import RunArtifactMissing, read_json, read_metrics
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
LINEAGE_FIELDS = ("snapshot_id", "t_handoff", "window_start", "handoff_offsets", "final_offsets", "newest_event_time")
SCORE_FIELDS = ("auc", "logloss", "auc_after_t", "auc_after_t_batch_only", "baseline_auc_after_t", "popularity_auc_after_t",
                "champion_auc_after_t", "val_auc", "baseline_val_auc", "chosen_epoch", "best_auc", "samples_iceberg",
                "samples_kafka")


@dataclass(frozen=True, kw_only=True)
class RegistryConfig:
    location: str
    """The data set's registry, a folder or s3://bucket/prefix: `Settings.registry` (SLIPSTREAM_REGISTRY,
    or SLIPSTREAM_DATASET__<NAME>__REGISTRY; default <home>/registry/<data set>). One per data set:
    a champion is only ever compared with models of its own data set."""
    tolerance: float = DEFAULT_TOLERANCE
    """SLIPSTREAM_PROMOTION_AUC_TOLERANCE: promote when challenger AUC >= champion AUC - this."""

    def __post_init__(self) -> None:
        if not 0 <= self.tolerance < 0.5:
            raise ConfigError(f"SLIPSTREAM_PROMOTION_AUC_TOLERANCE must be in [0, 0.5), got {self.tolerance}")

    @classmethod
    def from_env(cls, settings: Settings, env: Mapping[str, str] | None = None) -> RegistryConfig:
        """The registry of `settings`' data set (the location is the settings', never re-read from
        the environment, which names the deployment's default data set's), with the tolerance of `env`."""
        return settings_from_env(cls, env, prefix="SLIPSTREAM_", names=_REGISTRY_ENV,
                                 given={"location": settings.registry})


_REGISTRY_ENV = {"location": "SLIPSTREAM_REGISTRY", "tolerance": "SLIPSTREAM_PROMOTION_AUC_TOLERANCE"}


@dataclass(frozen=True)
class PromotionDecision:
    promoted: bool
    challenger_run_id: str
    challenger_auc: float | None
    champion_run_id: str | None
    champion_auc: float | None
    tolerance: float
    reason: str
    baseline_auc: float | None = None
    evaluated_on: str = ""
    """`after_t` (the future, the default) or `validation` (no stream phase: the last days before T)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _ci(metrics: Mapping[str, Any], key: str) -> str:
    lo, hi = (metrics.get(key) or [None, None])[:2]
    if lo is None or hi is None or not (math.isfinite(lo) and math.isfinite(hi)):
        return ""
    return f", 95% CI [{lo:+.4f}, {hi:+.4f}]"


def decide_promotion(challenger_run_id: str, metrics: Mapping[str, Any], champion: Mapping[str, Any] | None,
                     tolerance: float) -> PromotionDecision:
    """Promote a challenger that beats its own baseline on the future and is not worse than the
    champion re-scored on the same rows (within `tolerance`); see the module docstring."""
    a = _float_or_none(metrics.get("auc_after_t"))  # rows of one class after T have no AUC
    after = (_float_or_none(metrics.get("eval_rows_after_t")) or 0) > 0 and a is not None and math.isfinite(a)
    where = "after_t" if after else "validation"
    chall = _float_or_none(metrics.get("auc_after_t" if after else "val_auc"))
    base = _float_or_none(metrics.get("baseline_auc_after_t" if after else "baseline_val_auc"))
    rows = int(_float_or_none(metrics.get("eval_rows_after_t" if after else "val_rows")) or 0)
    champ_id = champion.get("run_id") if champion else None
    same_rows = _float_or_none(metrics.get("champion_auc_after_t")) if after else None
    same_id = metrics.get("champion_run_id")

    def verdict(promoted: bool, reason: str) -> PromotionDecision:
        return PromotionDecision(promoted, challenger_run_id, chall, champ_id, same_rows if same_id == champ_id else None,
                                 tolerance, reason, base, where)

    on = f"on {rows:,} {'rows after T' if after else 'validation rows'}"
    if chall is None or not math.isfinite(chall):
        return verdict(False, f"the challenger has no finite AUC {on} in metrics.json")
    if base is not None and math.isfinite(base) and chall <= base:
        return verdict(False, f"AUC {chall:.4f} does not beat its logistic-regression baseline {base:.4f} {on}"
                              f"{_ci(metrics, 'auc_diff_vs_baseline_ci')}: a model worse than the baseline is never promoted")
    beats = (f"AUC {chall:.4f} beats its baseline {base:.4f}{_ci(metrics, 'auc_diff_vs_baseline_ci')}"
             if base is not None and math.isfinite(base) else f"AUC {chall:.4f} (no baseline scored)")
    if champion is None:
        return verdict(True, f"no champion yet: the first model is promoted; {beats} {on}")
    if champ_id == challenger_run_id:
        return verdict(True, "the challenger is already the champion (re-published)")
    if not after:
        return verdict(False, f"{beats}, but without rows after T the champion {champ_id} cannot be compared on data "
                              "neither trained on: it stays (run the stream phase to judge on the future)")
    if same_id != champ_id or same_rows is None or not math.isfinite(same_rows):
        why = metrics.get("champion_note") or "it was not re-scored on this run's rows"
        return verdict(False, f"{beats} {on}, but the champion {champ_id} could not be compared ({why}): it stays")
    diff = chall - same_rows
    if diff >= -tolerance:
        return verdict(True, f"{beats}; vs the champion {champ_id} on the same {rows:,} rows after T: "
                             f"{chall:.4f} vs {same_rows:.4f} ({diff:+.4f}{_ci(metrics, 'auc_diff_vs_champion_ci')}), "
                             f"within the tolerance {tolerance}")
    return verdict(False, f"{beats}, but on the same {rows:,} rows after T the champion {champ_id} scores "
                          f"{same_rows:.4f} vs {chall:.4f} ({diff:+.4f}{_ci(metrics, 'auc_diff_vs_champion_ci')}), "
                          f"below the tolerance {tolerance}: the champion stays")


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
                return json.loads(f.read())
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

    def publish(self, run_path: Path, *, tolerance: float = DEFAULT_TOLERANCE) -> dict[str, Any]:
        """Copy the run's model package in, decide champion/challenger, return package.json."""
        run_id = run_path.name
        metrics = read_metrics(run_path)
        files: dict[str, dict[str, Any]] = {}
        for src_rel, name in PACKAGE_FILES.items():
            src = run_path / src_rel
            if not src.exists():
                raise RunArtifactMissing(f"{src} is missing: the trainer did not export run {run_id}; see the training log")
            data = src.read_bytes()
            self._write_bytes(self._path("models", run_id, name), data)
            files[name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        model_meta = read_json(run_path / "export/model.json", "exported model metadata")
        decision = decide_promotion(run_id, metrics, self.champion(), tolerance)
        package = {
            "run_id": run_id,
            "created_at": datetime.now(UTC).isoformat(),
            "schema_version": model_meta.get("schema_version", model_meta.get("SCHEMA_VERSION")),
            "lineage": {k: metrics[k] for k in LINEAGE_FIELDS if k in metrics},
            "metrics": {k: metrics[k] for k in SCORE_FIELDS if k in metrics},
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


def _float_or_none(value: Any) -> float | None:
    try:
        return None if value is None else float(value)
    except (TypeError, ValueError):
        return None
