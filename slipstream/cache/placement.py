"""Cache-aware scheduling for Kubernetes mode (Fluid's idea): the warmup pod runs on the cache
nodes and the training pod gets the same node affinity and the same cache volume, so training
lands where the cache is.

Pure data in Kubernetes' own JSON shape (camelCase, as in a pod manifest); no kubernetes or
airflow import. The Airflow side turns it into `V1Affinity`/`V1Volume`/... (e.g. with
`ApiClient()._ApiClient__deserialize(d, "V1Affinity")`, or by building the models field by field)
and puts the SAME placement on both pods.
"""

from __future__ import annotations

from typing import Any

from slipstream.cache.settings import CacheSettings
from slipstream.settings import Settings

VOLUME_NAME = "slipstream-cache"


def cache_placement(settings: Settings, cache: CacheSettings | None = None) -> dict[str, Any]:
    """Where cache-using pods run and how they see the cache:

    - `node_selector`: {label: value} of the cache nodes
    - `affinity`: requiredDuringSchedulingIgnoredDuringExecution on the same labels (the form the
      pod spec's `affinity` field takes; equivalent to the selector, and extendable with zones)
    - `volumes`: [the cache volume: hostPath (DirectoryOrCreate) or persistentVolumeClaim]
    - `volume_mounts`: [{name, mountPath}] for the container
    - `env`: {SLIPSTREAM_CACHE_DIR: mount path, the other SLIPSTREAM_CACHE_* settings}
    """
    cache = cache or CacheSettings.from_env(settings)
    if cache.volume.kind == "hostPath":
        volume: dict[str, Any] = {"name": VOLUME_NAME, "hostPath": {"path": cache.volume.source, "type": "DirectoryOrCreate"}}
    else:
        volume = {"name": VOLUME_NAME, "persistentVolumeClaim": {"claimName": cache.volume.source}}
    match = [{"key": k, "operator": "In", "values": [v]} for k, v in sorted(cache.node_selector.items())]
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": match}]}
        }
    } if match else {}
    return {
        "node_selector": dict(cache.node_selector),
        "affinity": affinity,
        "volumes": [volume],
        "volume_mounts": [{"name": VOLUME_NAME, "mountPath": cache.mount_path}],
        "env": {**cache.as_env(), "SLIPSTREAM_CACHE_DIR": cache.mount_path},
    }


def warmup_command(table: str, window_days: int, end_iso: str, snapshot_id: int | None) -> list[str]:
    """The warmup pod's argument list (the cache dir comes from the pod's SLIPSTREAM_CACHE_DIR)."""
    argv = ["slipstream", "cache", "warm", "--table", table, "--window-days", str(window_days),
            "--end", end_iso, "--json"]
    if snapshot_id is not None:
        argv += ["--snapshot", str(snapshot_id)]
    return argv
