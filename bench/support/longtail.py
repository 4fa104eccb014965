"""A long-tailed id stream for a feature spec, with a hidden model, and the trainer's step run over
it with hashed and with managed tables side by side (`slipstream bench embeddings`).

The data: every id feature with a role (user, item) draws its ids from an id space `space_factor`
times the table's rows (random 63-bit ids), Zipf-distributed. Before T the ids come from 80 % of
the space; after T a share of the draws comes from the other 20 % (ids never seen before T), set so
that `new_share` of the distinct ids of the stream are new. The hidden model: a bias per id and a
4-wide vector per id (the click is the sum of the biases plus the dot product of the user's and
the item's vectors, through a sigmoid), so an id that shares a row with another id is mispredicted.
The spec's other features get values of their kind (small vocabularies, lists, a standard normal
dense value) without effect.

The run: the trainer's `Stepper` (one process) for each table kind, built from the same spec
with the id tables switched to `table: hashed, buckets: rows` or `table: managed, rows: rows`,
stepped in lockstep on the same batches (so the machine's load falls on both alike): one pass over
the rows before T, then the stream after T scored before it is trained on (prequential: every
after-T score is of a row the model has not trained on).
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from slipstream.samples.spec import Spec, spec_from_dict
from trainers.data.rows import RowLayout, Rows

US_PER_DAY = 86_400 * 1_000_000
T_US = 1_795_000_000 * 1_000_000
"""T of the generated data (event time, µs); the window is the week before."""


@dataclass(frozen=True)
class LongTail:
    rows: int = 4_000
    """Rows of each id table (hashed: buckets; managed: rows)."""
    space_factor: int = 20
    before: int = 240_000
    """Samples before T."""
    after: int = 80_000
    """Samples after T (the stream)."""
    new_share: float = 0.30
    """Share of the stream's distinct ids that are new at T."""
    zipf: float = 1.05
    admit_after: int = 3
    eviction: str = "lru"
    seed: int = 0
    batch: int = 1_024
    stream_batch: int = 128
    """The trainer's defaults (data.batch_size, data.stream_batch_size)."""
    id_features: tuple[str, ...] = field(default=())
    """Filled from the spec: the id features with a role."""


@dataclass
class Population:
    ids: np.ndarray
    p: np.ndarray

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return self.ids[rng.choice(len(self.ids), n, p=self.p)]


def _zipf(n: int, a: float) -> np.ndarray:
    w: np.ndarray = 1.0 / np.arange(1, n + 1, dtype=np.float64) ** a
    weights: np.ndarray = w / w.sum()
    return weights


def _mixed_draw(rng: np.random.Generator, old: Population, new: Population, n: int, w: float) -> np.ndarray:
    take_new = rng.random(n) < w
    out = old.draw(rng, n)
    out[take_new] = new.draw(rng, int(take_new.sum()))
    return out


def _calibrate(rng_seed: int, old: Population, new: Population, n: int, target: float) -> float:
    """The share of draws from `new` that makes `target` of the distinct ids new (bisection)."""
    lo, hi = 0.0, 1.0
    new_set = new.ids
    for _ in range(12):
        w = (lo + hi) / 2
        ids = np.unique(_mixed_draw(np.random.default_rng(rng_seed), old, new, n, w))
        share = np.isin(ids, new_set).mean()
        lo, hi = (w, hi) if share < target else (lo, w)
    return (lo + hi) / 2


def id_features(spec: Spec) -> tuple[str, ...]:
    return tuple(f.name for f in spec.sparse if f.kind == "id" and f.role in ("user", "item"))


def make_data(spec: Spec, cfg: LongTail) -> tuple[Rows, Rows, dict[str, Any]]:
    """(rows before T, stream rows after T in time order, facts: new-at-T masks, the calibrated mix)."""
    rng = np.random.default_rng(cfg.seed)
    names = id_features(spec)
    space = cfg.rows * cfg.space_factor
    n_old = int(space * 0.8)
    before_cols: dict[str, np.ndarray] = {}
    after_cols: dict[str, np.ndarray] = {}
    effects: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    facts: dict[str, Any] = {}
    for name in names:
        ids = np.unique(rng.integers(0, 2**63 - 1, space + 64))[:space]
        ids = ids[rng.permutation(len(ids))]
        old = Population(ids[:n_old], _zipf(n_old, cfg.zipf))
        new = Population(ids[n_old:], _zipf(space - n_old, cfg.zipf))
        w = _calibrate(cfg.seed + 1, old, new, cfg.after, cfg.new_share)
        before_cols[name] = old.draw(rng, cfg.before)
        after_cols[name] = _mixed_draw(rng, old, new, cfg.after, w)
        order = np.argsort(ids)
        effects[name] = (ids[order], rng.normal(0, 0.6, space)[order], rng.normal(0, 0.55, (space, 4))[order])
        stream_ids = np.unique(after_cols[name])
        facts[name] = {"new_draw_share": w, "new_distinct_share": float(np.isin(stream_ids, new.ids).mean()),
                       "new_at_t": ~np.isin(after_cols[name], before_cols[name])}
    before = _table(spec, rng, before_cols, effects, names, T_US - 7 * US_PER_DAY, T_US, cfg.before)
    after = _table(spec, rng, after_cols, effects, names, T_US, T_US + US_PER_DAY // 4, cfg.after)
    layout = RowLayout.from_spec(spec)
    return Rows.from_arrow(before, layout, source=0), Rows.from_arrow(after, layout, source=1), facts


def _lookup(effects: tuple[np.ndarray, np.ndarray, np.ndarray], ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    keys, bias, vec = effects
    at = np.searchsorted(keys, ids)
    return bias[at], vec[at]


def _table(spec: Spec, rng: np.random.Generator, id_cols: dict[str, np.ndarray],
           effects: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]], names: tuple[str, ...],
           start_us: int, end_us: int, n: int) -> pa.Table:
    layout = RowLayout.from_spec(spec)
    logit = np.full(n, -0.4)
    vecs = []
    for name in names:
        b, v = _lookup(effects[name], id_cols[name])
        logit += b
        vecs.append(v)
    if len(vecs) == 2:
        logit += (vecs[0] * vecs[1]).sum(axis=1)
    label = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.int32)
    cols: dict[str, Any] = {
        "sample_id": pa.array([f"s{start_us}-{i}" for i in range(n)]),
        "event_time": pa.array(np.sort(rng.integers(start_us, end_us, n)), pa.int64()).cast(pa.timestamp("us", tz="UTC")),
    }
    for c in layout.sparse:
        cols[c] = pa.array(id_cols[c] if c in id_cols else rng.integers(0, 12, n) * 7919 + 1, pa.int64())
    for c in layout.dense:
        cols[c] = pa.array(rng.normal(0, 1, n).astype(np.float32))
    for c in layout.lists:
        lengths = rng.integers(0, 4, n)
        offsets = np.r_[0, np.cumsum(lengths)].astype(np.int32)
        shared = spec.feature(c).shares
        values = (id_cols[shared][rng.integers(0, n, int(offsets[-1]))] if shared in id_cols
                  else rng.integers(0, 20, int(offsets[-1])) * 104729 + 3)
        cols[c] = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, pa.int64()))
    cols["label"] = pa.array(label)
    return pa.table(cols, schema=layout.schema)


def variant_spec(spec: Spec, cfg: LongTail, kind: str, rows: int | None = None) -> Spec:
    """The spec with its id features' tables hashed (`buckets: rows`) or managed (`rows: rows`)."""
    raw = copy.deepcopy(dict(spec.raw))
    for name in id_features(spec):
        f = {k: v for k, v in raw["features"][name].items()
             if k not in ("buckets", "table", "rows", "admit_after", "eviction", "ttl_days")}
        if kind == "hashed":
            f.update(buckets=rows or cfg.rows)
        else:
            f.update(table="managed", rows=rows or cfg.rows, admit_after=cfg.admit_after, eviction=cfg.eviction)
        raw["features"][name] = f
    return spec_from_dict(raw, f"{spec.name} ({kind} id tables)")


def id_table_bytes(model: Any, names: tuple[str, ...]) -> tuple[int, int]:
    """(bytes of the id features' tables, vectors and first-order weights; bytes of their maps)."""
    tables = sum(p.numel() * p.element_size() for n, p in model.named_parameters()
                 if ".embedding_bags." in n and n.split(".")[-2] in names)
    maps = sum(b.numel() * b.element_size() for m in model.tables.managed.maps.values() for b in m.buffers())
    return tables, maps


def _stepper(spec: Spec, home: Path) -> Any:
    from slipstream.settings import Settings
    from trainers.config.schema import load_config
    from trainers.parallel.dist import Dist
    from trainers.step import Stepper

    cfg = load_config(None, ["data.snapshot_id=1", "data.t_handoff=2026-11-03T00:00:00+00:00", "run.run_id=bench",
                             "model.embed_dim=16", "model.bottom_mlp=[16]", "model.top_mlp=[32]",
                             "optim.table_optimizer=sparse_adam"], Settings(home=home))
    st = Stepper(cfg, Dist(rank=0, world=1, local_rank=0, device=torch.device("cpu"), backend="gloo"), spec)
    st.set_lr("batch")
    return st


def run_lockstep(specs: dict[str, Spec], before: Rows, after: Rows, cfg: LongTail, home: Path,
                 progress: Any = None) -> dict[str, dict[str, Any]]:
    """Each spec's model trained on the same batches, step by step in turn: one pass over `before`
    (shuffled), then `after` in time order, each stream batch scored before the step on it."""
    from trainers.eval.scoring import score

    steppers = {k: _stepper(s, home) for k, s in specs.items()}
    out: dict[str, dict[str, Any]] = {k: {"step_s": [], "probs": []} for k in specs}
    order = np.random.default_rng(cfg.seed + 7).permutation(len(before))
    shuffled = before.take(order)
    cpu = torch.device("cpu")
    n_batch = -(-len(before) // cfg.batch)
    n_stream = -(-len(after) // cfg.stream_batch)
    for i in range(n_batch + n_stream):
        stream = i >= n_batch
        if i == n_batch:
            for st in steppers.values():
                st.set_lr("stream")
        rows = (after.slice((i - n_batch) * cfg.stream_batch, (i - n_batch + 1) * cfg.stream_batch) if stream
                else shuffled.slice(i * cfg.batch, (i + 1) * cfg.batch))
        for kind, st in steppers.items():
            if stream:
                out[kind]["probs"].append(score(st.model, rows, cpu))
            t0 = time.perf_counter()
            st.step(rows, cfg.stream_batch if stream else cfg.batch)
            out[kind]["step_s"].append(time.perf_counter() - t0)
        if progress is not None:
            progress(i + 1, n_batch + n_stream)
    for kind, st in steppers.items():
        out[kind]["probs"] = np.concatenate(out[kind]["probs"])
        out[kind]["model"] = st.model
    return out


def collision_rate(rows_of_ids: np.ndarray) -> float:
    """Share of ids whose row another of these ids also has (`rows_of_ids`: each distinct id's row)."""
    if len(rows_of_ids) == 0:
        return 0.0
    _, inverse, counts = np.unique(rows_of_ids, return_inverse=True, return_counts=True)
    return float((counts[inverse] > 1).mean())


def measure(spec: Spec, cfg: LongTail, home: Path, progress: Any = None) -> dict[str, Any]:
    """The long-tail case's numbers: managed against hashed tables at the same memory (the hashed
    tables get the bytes of the managed ones' maps as extra rows) and at the same rows."""
    from slipstream.scoring import UserBootstrap, auc
    from trainers.config.schema import ModelConfig
    from trainers.models import build_model

    before, after, facts = make_data(spec, cfg)
    names = id_features(spec)
    managed = variant_spec(spec, cfg, "managed")
    table_bytes, map_bytes = id_table_bytes(build_model(managed, ModelConfig(embed_dim=16), 0), names)
    same_bytes_rows = int(cfg.rows * (table_bytes + map_bytes) / table_bytes)
    specs = {"hashed": variant_spec(spec, cfg, "hashed", same_bytes_rows), "hashed_same_rows": variant_spec(spec, cfg, "hashed"),
             "managed": managed}
    res = run_lockstep(specs, before, after, cfg, home, progress)
    cols = [f.name for f in spec.sparse]
    labels = after.label
    user = next((n for n in names if spec.feature(n).role == "user"), names[0])
    groups = after.sparse[:, cols.index(user)]
    new_rows = np.zeros(len(after), dtype=bool)
    for n in names:
        new_rows |= facts[n]["new_at_t"]
    pm = res["managed"]["probs"]
    out: dict[str, Any] = {
        "longtail_spec": spec.name, "longtail_id_tables": list(names), "longtail_rows": cfg.rows,
        "longtail_rows_hashed_same_memory": same_bytes_rows, "longtail_id_space": cfg.rows * cfg.space_factor,
        "longtail_zipf": cfg.zipf, "longtail_samples_before_t": cfg.before, "longtail_samples_after_t": cfg.after,
        "longtail_admit_after": cfg.admit_after, "longtail_eviction": cfg.eviction,
        "stream_new_id_share": {n: round(facts[n]["new_distinct_share"], 4) for n in names},
        "stream_new_id_row_share": {n: round(float(facts[n]["new_at_t"].mean()), 4) for n in names},
        "stream_rows_with_new_id": int(new_rows.sum()), "stream_rows_with_new_id_share": round(float(new_rows.mean()), 4),
        "auc_after_t_rows": int(len(labels)), "auc_after_t_managed": round(auc(labels, pm), 5),
        "auc_new_ids_rows": int(new_rows.sum()), "auc_new_ids_managed": round(auc(labels[new_rows], pm[new_rows]), 5),
    }
    # live ids: the distinct ids of the stream; hashed, every one has a row (its remainder), shared
    # or not; managed, the admitted ones (a row of their own) at the end
    live = {n: np.unique(after.sparse[:, cols.index(n)]) for n in names}
    # paired AUC differences with intervals over users; one resampler per row set, shared by both kinds
    on_all = UserBootstrap(labels, groups, rounds=400)
    on_new, pm_new = UserBootstrap(labels[new_rows], groups[new_rows], rounds=400, seed=1), pm[new_rows]
    for kind, rows in (("hashed", same_bytes_rows), ("hashed_same_rows", cfg.rows)):
        ph = res[kind]["probs"]
        gain = on_all.diff(pm, ph)
        gain_new = on_new.diff(pm_new, ph[new_rows])
        sfx = "" if kind == "hashed" else "_same_rows"
        hashed_rows = np.concatenate([np.remainder(live[n], rows) + j * rows for j, n in enumerate(names)])
        out.update({
            f"collision_rate_hashed{sfx}": round(collision_rate(hashed_rows), 4),
            f"auc_after_t_hashed{sfx}": round(auc(labels, ph), 5),
            f"auc_gain{sfx}": round(gain.value, 5), f"auc_gain{sfx}_ci_low": round(gain.lo, 5),
            f"auc_gain{sfx}_ci_high": round(gain.hi, 5),
            f"auc_new_ids_hashed{sfx}": round(auc(labels[new_rows], ph[new_rows]), 5),
            f"auc_new_ids_gain{sfx}_ci_low": round(gain_new.lo, 5), f"auc_new_ids_gain{sfx}_ci_high": round(gain_new.hi, 5),
            f"rows_in_use_hashed{sfx}": int(len(np.unique(np.concatenate(
                [np.remainder(np.concatenate([before.sparse[:, cols.index(n)], after.sparse[:, cols.index(n)]]), rows)
                 + j * rows for j, n in enumerate(names)])))),
        })
    maps = res["managed"]["model"].tables.managed.maps
    admitted = []
    for j, n in enumerate(names):
        got = maps[n].lookup(torch.from_numpy(live[n])).numpy()
        admitted.append(got[got > 0] + j * cfg.rows)
    step = {k: np.asarray(v["step_s"][3:]) for k, v in res.items()}
    out.update({
        "collision_rate_managed": round(collision_rate(np.concatenate(admitted)), 4),
        "live_ids": int(sum(len(v) for v in live.values())), "live_ids_admitted_managed": int(sum(len(a) for a in admitted)),
        "rows_in_use_managed": int(sum(m.rows_in_use for m in maps.values())),
        "rows_managed": {n: m.stats() for n, m in maps.items()},
        "table_bytes": table_bytes, "map_bytes": map_bytes,
        "map_bytes_per_row": round(map_bytes / (cfg.rows * len(names)), 1),
        "memory_bytes_managed": table_bytes + map_bytes,
        "memory_bytes_hashed": id_table_bytes(res["hashed"]["model"], names)[0],
        "step_ms_hashed": round(float(step["hashed_same_rows"].mean()) * 1e3, 3),
        "step_ms_managed": round(float(step["managed"].mean()) * 1e3, 3),
        "step_time_vs_hashed": round(float(step["managed"].mean() / step["hashed_same_rows"].mean()), 3),
    })
    return out
