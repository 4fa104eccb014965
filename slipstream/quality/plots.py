"""The report's figures, drawn with matplotlib (Agg) from profiles only, returned as PNG bytes."""

from __future__ import annotations

import io
from datetime import UTC, date, datetime
from typing import Any

import numpy as np

from slipstream.quality.drift import FeatureShift
from slipstream.quality.profiles import US_PER_HOUR, ColumnProfile, FeatureProfile
from slipstream.samples.spec import Spec


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80, bbox_inches="tight")
    _plt().close(fig)
    return buf.getvalue()


def _density(col: ColumnProfile, edges: np.ndarray) -> np.ndarray:
    assert col.hist is not None
    values, counts = col.hist.buckets()
    if counts.sum() == 0:
        return np.zeros(len(edges) - 1)
    h, _ = np.histogram(np.clip(values, edges[0], edges[-1]), bins=edges, weights=counts)
    density: np.ndarray = h / counts.sum()
    return density


def distributions(window: FeatureProfile, stream: FeatureProfile | None, spec: Spec) -> bytes:
    """The spec's dense features as histograms and its categoricals as top-k shares, window vs stream."""
    plt = _plt()
    names = [f.name for f in (*spec.dense, *(f for f in spec.features if f.kind == "categorical")) if f.name in window.columns]
    cols = 4
    rows = max(1, int(np.ceil(len(names) / cols)))
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 2.8 * rows), squeeze=False)
    for ax, name in zip(axes.flat, names):
        w = window.columns[name]
        s = stream.columns.get(name) if stream else None
        if w.kind == "numeric":
            # the feature's stored range (clip / scale), else what the window holds
            lo, hi = spec.feature(name).dense_range() or (w.min or 0.0, w.max or 0.0)
            edges = np.linspace(lo, hi if hi > lo else lo + 1.0, 41)
            centers = (edges[:-1] + edges[1:]) / 2
            ax.step(centers, _density(w, edges), where="mid", label="Iceberg window")
            if s is not None and s.kind == "numeric":
                ax.step(centers, _density(s, edges), where="mid", label="Kafka stream")
        else:
            assert w.topk is not None
            top = [k for k, _ in w.topk.top(10)]
            x = np.arange(len(top))
            tot = max(sum(w.topk.counts.values()) + w.topk.other, 1)
            ax.bar(x - 0.2, [w.topk.counts[k] / tot for k in top], 0.4, label="Iceberg window")
            if s is not None and s.topk is not None:
                stot = max(sum(s.topk.counts.values()) + s.topk.other, 1)
                ax.bar(x + 0.2, [s.topk.counts.get(k, 0) / stot for k in top], 0.4, label="Kafka stream")
            ax.set_xticks(x, [str(k)[-4:] for k in top], fontsize=6, rotation=60)
        ax.set_title(name, fontsize=9)
    for ax in list(axes.flat)[len(names):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.suptitle("Feature distributions")
    return _png(fig)


def drift_over_days(series: dict[date, list[FeatureShift]]) -> bytes:
    """Each feature's distance as a share of what its day allowed (chance at the day's size and
    its usual movement): above 1, the feature moved more than usual."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9, 3.5))
    days = sorted(series)
    feats = list(dict.fromkeys(s.feature for d in days for s in series[d]))
    for f in feats:
        ys = [next((s.score / s.threshold for s in series[d] if s.feature == f and s.threshold > 0), np.nan) for d in days]
        alarmed = [next((s.drifted for s in series[d] if s.feature == f), False) for d in days]
        line = ax.plot([str(d) for d in days], ys, marker=".", lw=1, label=f)[0]
        xs = [str(d) for d, a in zip(days, alarmed) if a]
        if xs:
            ax.plot(xs, [y for y, a in zip(ys, alarmed) if a], "o", ms=8, mfc="none", color=line.get_color())
    ax.axhline(1.0, color="red", ls="--", lw=0.8)
    ax.set_ylabel("distance / limit")
    ax.set_title("Drift over days (above the dashed line, circled: moved more than usual)")
    ax.legend(fontsize=6, loc="center left", bbox_to_anchor=(1.01, 0.5))
    ax.tick_params(axis="x", labelrotation=30, labelsize=7)
    return _png(fig)


def ctr_over_time(window: FeatureProfile, stream: FeatureProfile | None, t_handoff: datetime | None) -> bytes:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9, 3.2))
    for prof, label in ((window, "Iceberg window"), (stream, "Kafka stream")):
        if prof is None or not prof.ctr_by_hour:
            continue
        hours = sorted(prof.ctr_by_hour)
        x = [datetime.fromtimestamp(h * US_PER_HOUR / 1e6, tz=UTC) for h in hours]
        y = [k / n if n else np.nan for n, k in (prof.ctr_by_hour[h] for h in hours)]
        ax.plot(x, y, marker=".", lw=1, label=label)
    if t_handoff is not None:
        ax.axvline(t_handoff, color="gray", ls=":", label="handoff T")
    ax.set_ylabel("CTR per hour")
    ax.set_title("CTR over time")
    ax.legend(fontsize=7)
    fig.autofmt_xdate()
    return _png(fig)


def skew_bars(shifts: list[FeatureShift]) -> bytes:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9, 3.2))
    names = [s.feature for s in shifts]
    colors = ["tab:red" if s.drifted else "tab:blue" for s in shifts]
    ax.bar(names, [s.score for s in shifts], color=colors)
    for s, x in zip(shifts, range(len(shifts))):
        ax.hlines(s.threshold, x - 0.4, x + 0.4, colors="red", linestyles="--", lw=0.8)
    ax.set_ylabel("PSI / JS")
    ax.set_title("Batch-vs-stream skew per feature (dashed: its limit; red: over it)")
    ax.tick_params(axis="x", labelrotation=30, labelsize=7)
    return _png(fig)


def training_curve(points: list[dict[str, Any]], final: dict[str, Any] | None = None) -> bytes | None:
    """The logged training loss (and AUC) per step; `final` adds the run's end-of-run scores
    (metrics.json) at its last step when metrics.jsonl did not log it."""
    keys = [k for k in ("loss", "logloss", "auc") if any(k in p for p in points)]
    end_keys = [k for k in ("logloss", "auc") if final and k in final]
    if not keys and not end_keys:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9, 3))
    for k in keys:
        pts = [(p.get("step", i), p[k]) for i, p in enumerate(points) if k in p and p[k] is not None]
        # points as well as the line: a short run has one or two metrics lines, and a line through
        # a single point draws nothing
        ax.plot([a for a, _ in pts], [b for _, b in pts], label=k, marker="o" if len(pts) <= 50 else None, ms=4)
        if len(pts) <= 3:  # a few points are numbers: write them
            for a, b in pts:
                ax.annotate(f"{b:.4f}", (a, b), textcoords="offset points", xytext=(6, 4), fontsize=8)
    for k in end_keys:
        assert final is not None
        ax.plot([final["step"]], [final[k]], marker="*", ms=12, ls="none", label=f"{k} at the end (held out, metrics.json)")
        ax.annotate(f"{final[k]:.4f}", (final["step"], final[k]), textcoords="offset points", xytext=(8, 4), fontsize=8)
    ax.set_xlim(left=0)  # from the first step: a short run reads as short
    ax.set_xlabel("step")
    ax.set_title("Training curve (metrics.jsonl" + (", end of run from metrics.json)" if end_keys else ")"))
    ax.legend(fontsize=7)
    return _png(fig)


def validation_curve(curve: list[dict[str, Any]], chosen: int | None) -> bytes | None:
    """Validation loss and AUC per epoch, model and logistic baseline, the kept epoch marked."""
    if not curve:
        return None
    plt = _plt()
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3))
    epochs = [c["epoch"] for c in curve]
    for ax, key, title in ((left, "loss", "validation logloss"), (right, "auc", "validation AUC")):
        ax.plot(epochs, [c[key] for c in curve], marker="o", ms=4, label="model")
        ax.plot(epochs, [c[f"baseline_{key}"] for c in curve], marker="s", ms=4, ls="--", label="logistic baseline")
        if chosen is not None:
            ax.axvline(chosen, color="#2f855a", lw=1, ls=":", label=f"kept epoch {chosen}")
        ax.set_xlabel("epoch")
        ax.set_title(title)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return _png(fig)
