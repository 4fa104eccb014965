"""The hidden world of a generated data set for any feature spec (`slipstream.dev.specgen`).

From a seed: entity populations for the id-like fields (users, items: long-tailed popularity),
vocabularies for categoricals and list values, distributions for dense fields, the share of each
optional field that goes missing, the side tables, and the hidden logistic model.

The model is defined on the samples' own columns (hashed values, `transform.dense_values` of the
dense fields, the list values): a per-value effect for ids and categoricals, one coefficient per
dense feature, the mean value effect of a list or a sequence (a sequence reuses the effects of
the id it shares) and, when the spec names a user and an item, a user-item affinity: the dot
product of a latent taste vector per user and per item (`Affinity`). The additive part is what a
logistic regression over the features can learn; the affinity is what a recommender adds to it
(who likes what, beyond how much a user likes anything and how liked an item is). Without the
affinity the logistic baseline is the true model and no deep model can be shown better than it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from slipstream.samples.schema import field_arrow_type
from slipstream.samples.spec import FeatureSpec, FieldSpec, SourceSpec, Spec
from slipstream.samples.transform import sparse_values

ID_EFFECT_SD = 0.4
"""Spread of the per-entity effects (a user's or an item's own click propensity)."""
LIST_EFFECT_SD = 0.5
SEQUENCE_COEF = 0.5
"""A sequence adds this times the mean effect of the ids in it (a taste for popular-and-good items)."""
SIGNAL_SD = 1.3
"""Target spread of the whole logit: with the ids' share, it puts the best AUC near 0.75-0.8."""
HEAD_VALUES = 50
"""Values of a categorical or id with a full-size effect; rarer ones have smaller effects."""
TABLE_MISSING_KEYS = 0.05
"""Share of entities without a side-table row: they take the table's defaults."""
AFFINITY_SD = 1.0
"""Spread of the user-item affinity term on the logit (generated specs with a user and an item)."""
AFFINITY_FACTORS = 4
"""Latent dimensions of the affinity (tastes: a user likes some kinds of items more than others)."""


@dataclass
class Vocab:
    """The values a field takes and how popular each is (Zipf-like: a few values most of the time)."""

    values: pa.Array
    weights: np.ndarray

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.choice(len(self.values), n, p=self.weights)


def zipf_weights(n: int, a: float) -> np.ndarray:
    w: np.ndarray = 1.0 / np.arange(1, n + 1, dtype=np.float64) ** a
    weights: np.ndarray = w / w.sum()
    return weights


@dataclass
class FieldPlan:
    """How the values of one raw field are drawn."""

    kind: str
    """entity | categorical | list | dense | filler."""
    type: str
    vocab: Vocab | None = None
    missing: float = 0.0
    dense: tuple[str, float, float] = ("normal", 0.0, 1.0)
    """(lognormal | normal, location, spread) of a dense field's raw values."""
    separator: str | None = None


@dataclass
class Effects:
    """Per-value effects on the logit, keyed by the value as a sample column holds it."""

    keys: np.ndarray
    effects: np.ndarray

    @classmethod
    def of(cls, keys: np.ndarray, effects: np.ndarray) -> Effects:
        order = np.argsort(keys, kind="stable")
        return cls(keys[order], effects[order])

    def lookup(self, values: np.ndarray) -> np.ndarray:
        """The effect of each value; 0 for a value outside the vocabulary (a default, a collision)."""
        if len(self.keys) == 0:
            return np.zeros(len(values))
        i = np.clip(np.searchsorted(self.keys, values), 0, len(self.keys) - 1)
        return np.where(self.keys[i] == values, self.effects[i], 0.0)


@dataclass
class World:
    spec: Spec
    plans: dict[tuple[str, str], FieldPlan]
    """(source, field) -> how its values are drawn."""
    sparse: dict[str, Effects]
    """id and categorical features -> per-value effects."""
    pooled: dict[str, tuple[Effects, float]]
    """list and sequence features -> (per-value effects, coefficient on their mean)."""
    dense_importance: dict[str, float]
    """dense feature -> the spread its term adds to the logit (divided by the column's spread)."""
    tables: dict[str, pa.Table] = field(default_factory=dict)
    affinity: Affinity | None = None
    """The user-item affinity term (None: the model is additive)."""


@dataclass
class Affinity:
    """`sd * <users[u], items[i]>`: a latent taste vector per user and per item (unit variance of
    the product); a value outside the vocabulary (a default, a collision) has no taste."""

    user: str
    item: str
    """The features whose sample columns name the user and the item."""
    user_rows: Effects
    item_rows: Effects
    """Sample value -> row of `users` / `items` + 1 (0: no row)."""
    users: np.ndarray
    items: np.ndarray
    sd: float

    def terms(self, samples: pa.Table) -> np.ndarray:
        u = self.user_rows.lookup(samples.column(self.user).to_numpy()).astype(np.int64)
        i = self.item_rows.lookup(samples.column(self.item).to_numpy()).astype(np.int64)
        dot = np.einsum("nk,nk->n", self.users[u], self.items[i])
        out: np.ndarray = self.sd * dot / np.sqrt(self.users.shape[1])
        return out


def affinity_of(spec: Spec, sparse: dict[str, Effects], rng: np.random.Generator, sd: float,
                factors: int = AFFINITY_FACTORS) -> Affinity | None:
    """The affinity between the spec's user and item ids (None: `sd` 0, or the spec does not name
    both as id features)."""
    user, item = spec.with_role("user"), spec.with_role("item")
    if sd <= 0 or user is None or item is None or user.name not in sparse or item.name not in sparse:
        return None

    def vectors(keys: np.ndarray) -> tuple[Effects, np.ndarray]:
        rows = np.vstack([np.zeros((1, factors)), rng.normal(0.0, 1.0, (len(keys), factors))])
        return Effects.of(keys, np.arange(1, len(keys) + 1, dtype=np.float64)), rows

    user_rows, users = vectors(sparse[user.name].keys)
    item_rows, items = vectors(sparse[item.name].keys)
    return Affinity(user.name, item.name, user_rows, item_rows, users, items, sd)


def _roles(spec: Spec) -> dict[tuple[str, str], tuple[str, FeatureSpec | None]]:
    """(source, field) -> (role, the feature that gives it) for the fields the features read."""
    ev = spec.events.name
    roles: dict[tuple[str, str], tuple[str, FeatureSpec | None]] = {}
    user = spec.with_role("user")
    if user is not None and user.table is None:  # the first entity field gets the users' population
        roles[(ev, user.column)] = ("entity", user)
    for f in spec.features:
        if f.kind == "sequence":
            roles.setdefault((ev, f.per or ""), ("entity", None))
    for f in spec.features:
        src = f.table or ev
        role = {"id": "entity", "categorical": "categorical", "list": "list", "dense": "dense",
                "sequence": "entity"}[f.kind]
        roles.setdefault((src, f.column), (role, f))
    for t in spec.tables:
        roles.setdefault((ev, t.key or ""), ("entity", None))
        roles[(t.name, t.key or "")] = ("key", None)
    return roles


def _typed(values: np.ndarray, type_name: str) -> pa.Array:
    return pa.array(values, field_arrow_type(type_name))


def _entity_vocab(rng: np.random.Generator, fs: FieldSpec, n: int) -> Vocab:
    if fs.type == "string":
        values = np.char.add(f"{fs.name}-", np.arange(1, n + 1).astype(str)).astype(object)
    else:
        values = np.arange(1, n + 1)
    return Vocab(_typed(values, fs.type), zipf_weights(n, 0.8))


def _categorical_vocab(rng: np.random.Generator, type_name: str, cap: int, a: float = 1.05) -> Vocab:
    n = int(round(np.exp(rng.uniform(np.log(3), np.log(max(cap, 3))))))
    codes = rng.choice(2**32, n, replace=False)
    if type_name == "boolean":
        return Vocab(pa.array([False, True]), np.array([0.7, 0.3]))
    if type_name in ("string", "list<string>"):
        values: np.ndarray = np.char.mod("%08x", codes).astype(object)
        return Vocab(pa.array(values, pa.string()), zipf_weights(n, a))
    return Vocab(pa.array(np.sort(rng.choice(10 * n, n, replace=False)), pa.int64()), zipf_weights(n, a))


def _dense_plan(f: FeatureSpec | None) -> tuple[str, float, float]:
    """Raw values that spread over the feature's clip range after its transform."""
    if f is not None and f.clip is not None:
        lo, hi = f.clip
        if f.log1p:  # counts: lognormal, most of the mass in the low part of the log range
            return "lognormal", lo + 0.15 * (hi - lo), max(0.1 * (hi - lo), 0.3)
        return "normal", lo + 0.6 * (hi - lo), (hi - lo) / 6
    if f is not None and f.log1p:
        return "lognormal", 1.5, 1.2
    return "normal", 0.0, 1.0


def plan_fields(spec: Spec, rng: np.random.Generator, users: int, items: int, max_vocab: int,
                missing: bool) -> dict[tuple[str, str], FieldPlan]:
    roles = _roles(spec)
    entities: dict[str, Vocab] = {}
    plans: dict[tuple[str, str], FieldPlan] = {}
    ev = spec.events
    for (src, name), (role, _feat) in roles.items():
        if role != "entity" or src != ev.name or name not in ev.field_names:
            continue
        vocab = _entity_vocab(rng, ev.field(name), users if not entities else items)
        entities[name] = vocab
        plans[(src, name)] = FieldPlan("entity", ev.field(name).type, vocab)
    for source in spec.sources:
        for fs in source.fields:
            key = (source.name, fs.name)
            if key in plans:
                continue
            role, feat = roles.get(key, ("filler", None))
            if role == "key":
                plans[key] = FieldPlan("key", fs.type, entities.get(fs.name) or _entity_vocab(rng, fs, users))
                continue
            miss = float(rng.uniform(0.02, 0.3)) if missing and fs.optional else 0.0
            cap = min(max_vocab, max((feat.buckets or max_vocab) // 4, 3)) if feat is not None else 8
            if role in ("categorical", "entity"):
                plans[key] = FieldPlan("categorical", fs.type, _categorical_vocab(rng, fs.type, cap), miss)
            elif role == "list":
                plans[key] = FieldPlan("list", fs.type, _categorical_vocab(rng, fs.type, cap, a=0.8), miss,
                                       separator=feat.separator if feat is not None else None)
            elif role == "dense":
                plans[key] = FieldPlan("dense", fs.type, missing=miss, dense=_dense_plan(feat))
            else:
                plans[key] = FieldPlan("filler", fs.type, _categorical_vocab(rng, fs.type, 8), miss)
    return plans


def draw_field(rng: np.random.Generator, plan: FieldPlan, n: int) -> pa.Array:
    """n values of one field; a missing optional value is null (the file leaves it out)."""
    typ = field_arrow_type(plan.type)
    if plan.kind == "dense":
        dist, a, b = plan.dense
        x = rng.lognormal(a, b, n) - 1 if dist == "lognormal" else rng.normal(a, b, n)
        if plan.type == "boolean":
            arr = pa.array(rng.random(n) < 0.5)
        else:
            arr = pa.array(np.maximum(np.round(x), 0) if plan.type in ("long", "int") and dist == "lognormal"
                           else (np.round(x) if plan.type in ("long", "int") else x)).cast(typ)
    elif plan.kind == "list" or plan.type.startswith("list<"):
        arr = _draw_list(rng, plan, n)
    elif plan.type == "timestamp":
        arr = pa.array(rng.integers(1_700_000_000, 1_800_000_000, n) * 1_000_000, pa.int64()).cast(typ)
    else:
        assert plan.vocab is not None
        arr = plan.vocab.values.take(pa.array(plan.vocab.draw(rng, n))).cast(typ)
    if plan.missing:
        mask = pa.array(rng.random(n) < plan.missing)
        arr = pc.if_else(mask, pa.nulls(n, typ), arr)
    return arr


def _draw_list(rng: np.random.Generator, plan: FieldPlan, n: int) -> pa.Array:
    assert plan.vocab is not None
    lengths = rng.integers(0, 4, n)
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    values = plan.vocab.values.take(pa.array(plan.vocab.draw(rng, int(offsets[-1]))))
    lists = pa.ListArray.from_arrays(pa.array(offsets), values)
    if plan.type.startswith("list<"):
        return lists.cast(field_arrow_type(plan.type))
    sep = plan.separator or ","
    return pc.binary_join(pc.cast(lists, pa.list_(pa.string())), sep)


def _tail_shrink(vocab: Vocab) -> np.ndarray:
    """Rare values matter less (and a model sees them too rarely to learn much): a value's effect
    shrinks with the square root of its popularity below the HEAD_VALUES-th value's."""
    if vocab.weights.size <= HEAD_VALUES:
        return np.ones(vocab.weights.size)
    cut = np.sort(vocab.weights)[::-1][HEAD_VALUES - 1]
    shrink: np.ndarray = np.sqrt(np.minimum(vocab.weights / cut, 1.0))
    return shrink


def hidden_model(spec: Spec, plans: dict[tuple[str, str], FieldPlan], rng: np.random.Generator
                 ) -> tuple[dict[str, Effects], dict[str, tuple[Effects, float]], dict[str, float]]:
    ev = spec.events.name
    cache: dict[str, int] = {}
    graded = [f for f in spec.features if f.kind in ("categorical", "dense")]
    raw = rng.exponential(1.0, len(graded)) * (rng.random(len(graded)) >= 0.25)
    if len(graded) and not raw.any():
        raw[0] = 1.0
    fixed = ID_EFFECT_SD**2 * sum(f.kind == "id" for f in spec.features)
    rest = np.sqrt(max(SIGNAL_SD**2 - fixed, 0.3))
    importance = dict(zip((f.name for f in graded), raw / max(np.sqrt((raw**2).sum()), 1e-12) * rest))
    sparse: dict[str, Effects] = {}
    by_field: dict[tuple[str, str], np.ndarray] = {}
    for f in spec.features:
        if f.kind not in ("id", "categorical"):
            continue
        plan = plans[(f.table or ev, f.column)]
        assert plan.vocab is not None
        sd = ID_EFFECT_SD if f.kind == "id" else importance[f.name]
        base = by_field.setdefault((f.table or ev, f.column), rng.normal(0, 1, len(plan.vocab.values)) * _tail_shrink(plan.vocab))
        eff = base * sd
        sparse[f.name] = Effects.of(sparse_values(plan.vocab.values, cache, hash_all=f.kind == "categorical"), eff)
    pooled: dict[str, tuple[Effects, float]] = {}
    for f in spec.features:
        if not f.is_list:
            continue
        plan = plans[(f.table or ev, f.column)]
        assert plan.vocab is not None
        raw_ids = f.shares is not None and spec.feature(f.shares).kind == "id"
        keys = sparse_values(plan.vocab.values, cache, hash_all=not raw_ids)
        if f.kind == "sequence":
            shared = by_field.get((ev, f.column))
            eff = shared * ID_EFFECT_SD if shared is not None else rng.normal(0, ID_EFFECT_SD, len(keys))
            pooled[f.name] = (Effects.of(keys, eff), SEQUENCE_COEF)
        else:
            pooled[f.name] = (Effects.of(keys, rng.normal(0, LIST_EFFECT_SD, len(keys))), 1.0)
    return sparse, pooled, {k: v for k, v in importance.items() if spec.feature(k).kind == "dense"}


def side_tables(spec: Spec, plans: dict[tuple[str, str], FieldPlan], rng: np.random.Generator) -> dict[str, pa.Table]:
    """One row per entity of each table's key, less a few (those take the table's defaults)."""
    out = {}
    for t in spec.tables:
        key_plan = plans[(t.name, t.key or "")]
        assert key_plan.vocab is not None
        keys = key_plan.vocab.values.filter(pa.array(rng.random(len(key_plan.vocab.values)) >= TABLE_MISSING_KEYS))
        n = len(keys)
        cols = {fs.name: keys.cast(field_arrow_type(fs.type)) if fs.name == t.key
                else draw_field(rng, plans[(t.name, fs.name)], n) for fs in t.fields}
        out[t.name] = pa.table(cols, schema=_schema(t))
    return out


def _schema(source: SourceSpec) -> pa.Schema:
    return pa.schema([pa.field(f.name, field_arrow_type(f.type)) for f in source.fields])


def build_world(spec: Spec, *, seed: int, users: int, items: int, max_vocab: int, missing: bool = True,
                affinity: float = 0.0) -> World:
    """The world of `seed`; `affinity`: the spread of the user-item affinity term (0: none). The
    affinity is drawn from a generator of its own, so the rest of the world is the same either way."""
    rng = np.random.default_rng([seed, 1])
    plans = plan_fields(spec, rng, users, items, max_vocab, missing)
    sparse, pooled, dense = hidden_model(spec, plans, rng)
    tastes = affinity_of(spec, sparse, np.random.default_rng([seed, 3]), affinity)
    return World(spec, plans, sparse, pooled, dense, side_tables(spec, plans, rng), tastes)


def logit_terms(world: World, samples: pa.Table) -> np.ndarray:
    """The hidden logit of each sample without its dense terms and bias."""
    z = np.zeros(samples.num_rows)
    for name, eff in world.sparse.items():
        z += eff.lookup(samples.column(name).to_numpy())
    for name, (eff, coef) in world.pooled.items():
        col = samples.column(name).combine_chunks()
        offsets = np.asarray(col.offsets.to_numpy(), dtype=np.int64)
        values = eff.lookup(col.values.to_numpy(zero_copy_only=False)) if len(col.values) else np.zeros(0)
        sums = np.add.reduceat(np.append(values, 0.0), offsets[:-1]) if len(values) else np.zeros(len(col))
        lengths = np.diff(offsets)
        z += coef * np.where(lengths > 0, sums / np.maximum(lengths, 1), 0.0)
    if world.affinity is not None:
        z += world.affinity.terms(samples)
    return z
