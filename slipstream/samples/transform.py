"""The spec's feature transforms, at the Arrow level: one implementation for every path.

Spark's job calls these inside `mapInArrow` tasks (the rows of one task sorted by the sequence's
key and time), the stream joiner on each batch of joined events, the generator and the tests on
plain tables. Everything is vectorised (Arrow compute, numpy); a distinct categorical string is
hashed once per transform.

The steps, in order (`Featurizer.samples`):
1. defaults: a missing (null) optional field takes the spec's default; for a feature with
   `missing: indicator`, which rows lacked the value is noted first;
2. side tables: each `table` source is joined on its key (a missing key takes the table's
   defaults, and counts as a missing value for an indicator);
3. features: ids (longs as they are, strings hashed), categoricals (hashed), dense numbers
   (`log1p`, `clip`, `/ scale`), lists (hashed values) and sequences (the earlier values of a field
   per key, same UTC day, most recent last; `SequenceHistory` carries a key's tail across batches),
   and each derived `<name>_missing` indicator (1.0 where the value was absent, else 0.0);
4. the label, for `column` and `rule` labels (a click-within label is joined before: by Spark's
   cogroup or the joiner's window).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from slipstream.errors import ConfigError
from slipstream.samples.schema import field_arrow_type, hash_category, id_hash, sample_arrow_schema
from slipstream.samples.spec import EVENT_TIME, LABEL, SAMPLE_ID, FeatureSpec, Spec

US_PER_DAY = 86_400_000_000
NO_DAY = -(1 << 62)
ID_SEPARATOR = "\x1f"


def hash_strings(values: pa.Array | pa.ChunkedArray, cache: dict[str, int] | None = None) -> np.ndarray:
    """`hash_category` of every value (each distinct string hashed once), as int64."""
    arr = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    if len(arr) == 0:
        return np.zeros(0, dtype=np.int64)
    encoded = pc.dictionary_encode(arr)
    cache = {} if cache is None else cache
    lut = np.array([cache.get(v) if v in cache else cache.setdefault(v, hash_category(v))
                    for v in encoded.dictionary.to_pylist()], dtype=np.int64)
    hashed: np.ndarray = lut[encoded.indices.to_numpy(zero_copy_only=False)]
    return hashed


def _canonical_text(col: pa.ChunkedArray | pa.Array) -> pa.Array:
    """A column as text for an id hash: timestamps as epoch microseconds, the rest as Arrow casts."""
    if pa.types.is_timestamp(col.type):
        col = pc.cast(pc.cast(col, pa.timestamp("us", tz="UTC")), pa.int64())
    text = pc.cast(col, pa.string())
    out = pc.fill_null(text, "")
    return out.combine_chunks() if isinstance(out, pa.ChunkedArray) else out


def sample_ids(spec: Spec, events: pa.Table) -> pa.Array:
    """The events' sample ids: the id field as text, or `h` + 16 hex digits of the FNV-1a hash of
    the id fields' values joined by U+001F (a log without ids; the same record, the same id)."""
    rule = spec.events.id
    if isinstance(rule, str):
        return _canonical_text(events.column(rule))
    if rule is None:  # load_spec refuses such a spec; one built in code may lack it
        raise ConfigError(f"events source {spec.events.name!r} has no `id:` (the id field, or {{hash: [fields]}})")
    names = spec.events.field_names if rule == ("*",) else rule
    joined = pc.binary_join_element_wise(*[_canonical_text(events.column(n)) for n in names], ID_SEPARATOR)
    h = id_hash(joined)
    hexed = np.char.mod("%016x", h.astype(np.uint64))
    return pa.array(np.char.add("h", hexed).astype(object), pa.string())


def fill_defaults(spec: Spec, source: str, table: pa.Table) -> pa.Table:
    """Optional fields: nulls (and absent columns) take the spec's default, cast to the field's type."""
    src = spec.source(source)
    for f in src.fields:
        typ = field_arrow_type(f.type)
        if f.name not in table.column_names:
            if not f.optional:
                continue  # the caller rejects records without a required field
            value = pa.nulls(table.num_rows, typ) if f.default is None else pa.array([f.default] * table.num_rows, typ)
            table = table.append_column(pa.field(f.name, typ), value)
            continue
        if f.optional and f.default is not None:
            i = table.column_names.index(f.name)
            col = table.column(i)
            if col.null_count:
                table = table.set_column(i, f.name, pc.fill_null(pc.cast(col, typ), pa.scalar(f.default, typ)))
    return table


def join_tables(spec: Spec, events: pa.Table, tables: Mapping[str, pa.Table],
                missing: dict[str, pa.Array] | None = None) -> pa.Table:
    """Add `<table>.<field>` columns for the side-table fields the features read (left join on
    the table's key; an events row without a match takes the table's defaults). `missing`, when
    given, gets for each such column where the value was absent (no row for the key, or the row
    without it) before the default filled it."""
    wanted: dict[str, list[str]] = {}
    for f in spec.features:
        if f.table is not None:
            wanted.setdefault(f.table, [])
            if f.column not in wanted[f.table]:
                wanted[f.table].append(f.column)
    for name, cols in wanted.items():
        src = spec.source(name)
        key = src.key or ""
        side = tables.get(name)
        if side is None:
            side = pa.table({c: pa.array([], field_arrow_type(src.field(c).type)) for c in (key, *cols)})
        for c in cols:  # a column the table lacks: absent everywhere
            if c not in side.column_names:
                typ = field_arrow_type(src.field(c).type)
                side = side.append_column(pa.field(c, typ), pa.nulls(side.num_rows, typ))
        side = side.select([key, *cols])
        side = side.rename_columns([key, *(f"{name}.{c}" for c in cols)])
        side = last_per_key(side, key)
        keys = events.column(key)
        idx = pc.index_in(keys, value_set=side.column(key))
        for c in cols:
            out = side.column(f"{name}.{c}").take(idx)
            if missing is not None:
                missing[f"{name}.{c}"] = pc.is_null(out)
            fs = src.field(c)
            if fs.optional and fs.default is not None:
                out = pc.fill_null(pc.cast(out, field_arrow_type(fs.type)), pa.scalar(fs.default, field_arrow_type(fs.type)))
            events = events.append_column(f"{name}.{c}", out)
    return events


def last_per_key(side: pa.Table, key: str) -> pa.Table:
    """One row per key (the last one in the table: a side table appended to keeps its newest row)."""
    keys = side.column(key)
    if pc.count_distinct(keys).as_py() == side.num_rows:
        return side
    rev = side.take(pa.array(np.arange(side.num_rows - 1, -1, -1)))
    first = pc.index_in(pc.unique(rev.column(key)), value_set=rev.column(key))
    return rev.take(first)


def dense_values(f: FeatureSpec, col: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """`clip(log1p(max(x, 0)) or x, lo, hi) / scale` in float64, stored as float32."""
    x: np.ndarray = pc.cast(col, pa.float64()).to_numpy(zero_copy_only=False)
    x = np.asarray(x, dtype=np.float64)
    if f.log1p:
        x = np.log1p(np.maximum(x, 0.0))
    if f.clip is not None:
        x = np.clip(x, f.clip[0], f.clip[1])
    return (x / f.scale).astype(np.float32)


def sparse_values(col: pa.ChunkedArray | pa.Array, cache: dict[str, int], *, hash_all: bool) -> np.ndarray:
    """Integer ids as they are (`hash_all` False), anything else hashed as text."""
    typ = col.type
    if not hash_all and (pa.types.is_integer(typ)):
        return np.asarray(pc.cast(col, pa.int64()).to_numpy(zero_copy_only=False), dtype=np.int64)
    return hash_strings(pc.cast(col, pa.string()), cache)


def list_values(f: FeatureSpec, col: pa.ChunkedArray | pa.Array, cache: dict[str, int], hash_all: bool) -> pa.Array:
    """A list column of int64: split on the separator (string fields), each value as `sparse_values`."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if f.separator is not None and pa.types.is_string(arr.type):
        arr = pc.split_pattern(pc.fill_null(arr, ""), f.separator)  # "" splits into [""]: dropped below
    arr = pc.fill_null(arr, pa.scalar([], arr.type))
    flat = pc.list_flatten(arr)
    if pa.types.is_string(flat.type) and f.separator is not None:
        keep = pc.not_equal(flat, "")
        lengths = pc.list_value_length(arr).to_numpy(zero_copy_only=False)
        keep_np = keep.to_numpy(zero_copy_only=False)
        rows = np.repeat(np.arange(len(arr)), lengths)
        lengths = np.bincount(rows[keep_np], minlength=len(arr))
        flat = flat.filter(keep)
        offsets = np.zeros(len(arr) + 1, dtype=np.int32)
        np.cumsum(lengths, out=offsets[1:])
    else:
        offsets = np.asarray(arr.offsets.to_numpy(zero_copy_only=False), dtype=np.int32)
        offsets = offsets - offsets[0]
    values = sparse_values(flat, cache, hash_all=hash_all)
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(values, pa.int64()))


class SequenceHistory:
    """The earlier values of one field per key, within the same UTC day, most recent last.

    `rows` must arrive sorted by (key, time, sample id) within a stream of batches (Spark's
    task order): a key's rows may span batches, so the last `length` values of the previous
    batch's last key are carried over. The joiner keeps per-key state instead
    (`KeyedSequenceState`); both give the same lists for the same events.
    """

    def __init__(self, length: int) -> None:
        self.length = length
        self._carry_key: tuple[int, int] | None = None
        self._carry = np.empty(0, dtype=np.int64)

    def __call__(self, keys: np.ndarray, days: np.ndarray, values: np.ndarray) -> pa.ListArray:
        n = len(keys)
        if n == 0:
            return pa.ListArray.from_arrays(pa.array([0], pa.int32()), pa.array([], pa.int64()))
        first = (int(keys[0]), int(days[0]))
        carry = self._carry if first == self._carry_key else self._carry[:0]
        c = len(carry)
        all_values = np.concatenate([carry, values]) if c else values
        all_keys = np.concatenate([np.full(c, keys[0]), keys]) if c else keys
        all_days = np.concatenate([np.full(c, days[0]), days]) if c else days
        m = len(all_keys)
        idx = np.arange(m, dtype=np.int64)
        new_run = np.ones(m, dtype=bool)
        new_run[1:] = (all_keys[1:] != all_keys[:-1]) | (all_days[1:] != all_days[:-1])
        run_start = np.maximum.accumulate(np.where(new_run, idx, 0))
        # carried rows hold at most `length` values, so a position capped at `length` is exact
        lengths = np.minimum(idx - run_start, self.length)[c:]
        offsets = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(lengths, out=offsets[1:])
        first_of = np.repeat(idx[c:] - lengths, lengths)
        within = np.arange(int(offsets[-1]), dtype=np.int64) - np.repeat(offsets[:-1].astype(np.int64), lengths)
        out_values = all_values[first_of + within]
        tail = max(int(run_start[-1]), m - self.length)
        self._carry_key = (int(all_keys[-1]), int(all_days[-1]))
        self._carry = all_values[tail:].copy()
        return pa.ListArray.from_arrays(pa.array(offsets), pa.array(out_values, pa.int64()))


class KeyedSequenceState:
    """`SequenceHistory` for a stream: each key's last `length` values of the current UTC day are
    kept between batches (the joiner's state), so a batch only needs its own rows sorted by
    (key, time, sample id) and a key may come back in any later batch. `changed` names the keys
    written since `take_changes`; `take_changes`/`load` carry the tails across restarts (as Arrow)."""

    def __init__(self, length: int) -> None:
        self.length = length
        self.tails: dict[int, tuple[int, np.ndarray]] = {}
        self.changed: set[int] = set()

    def __call__(self, keys: np.ndarray, days: np.ndarray, values: np.ndarray) -> pa.ListArray:
        n = len(keys)
        if n == 0:
            return pa.ListArray.from_arrays(pa.array([0], pa.int32()), pa.array([], pa.int64()))
        starts = np.flatnonzero(np.r_[True, (keys[1:] != keys[:-1]) | (days[1:] != days[:-1])])
        run_keys, run_days = keys[starts].tolist(), days[starts].tolist()
        none = (NO_DAY, values[:0])
        carried = [t[1] if (t := self.tails.get(k, none))[0] == d else none[1] for k, d in zip(run_keys, run_days)]
        sizes = np.fromiter(map(len, carried), dtype=np.int64, count=len(carried))
        run_len = np.diff(np.r_[starts, n])
        # the batch with each run's carried tail inserted before it: [tail0, run0, tail1, run1, ...]
        run_sizes = sizes + run_len
        begins = np.cumsum(run_sizes) - run_sizes
        all_values = np.empty(int(run_sizes.sum()), dtype=np.int64)
        is_new = np.ones(len(all_values), dtype=bool)
        carried_at = np.repeat(begins, sizes) + np.arange(int(sizes.sum())) - np.repeat(np.cumsum(sizes) - sizes, sizes)
        is_new[carried_at] = False
        all_values[is_new] = values
        if len(carried_at):
            all_values[carried_at] = np.concatenate(carried)
        run_start = np.repeat(begins, run_sizes)
        idx = np.arange(len(all_values), dtype=np.int64)
        lengths = np.minimum(idx - run_start, self.length)[is_new]
        offsets = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(lengths, out=offsets[1:])
        first_of = np.repeat(idx[is_new] - lengths, lengths)
        within = np.arange(int(offsets[-1]), dtype=np.int64) - np.repeat(offsets[:-1].astype(np.int64), lengths)
        out = pa.ListArray.from_arrays(pa.array(offsets), pa.array(all_values[first_of + within], pa.int64()))
        # each run's new tail: its last `length` values, copied out of the batch into one small array
        ends = begins + run_sizes
        tail_len = np.minimum(run_sizes, self.length)
        tail_at = np.repeat(ends - tail_len, tail_len) + np.arange(int(tail_len.sum())) - \
            np.repeat(np.cumsum(tail_len) - tail_len, tail_len)
        compact, cut = all_values[tail_at], np.cumsum(tail_len).tolist()
        tails = [compact[a:b] for a, b in zip([0, *cut[:-1]], cut)]
        self.tails.update(zip(run_keys, zip(run_days, tails)))
        self.changed.update(run_keys)
        return out

    def take_changes(self) -> pa.Table:
        """The tails written since the last call: key, day, values (most recent last)."""
        keys = [k for k in self.changed if k in self.tails]
        self.changed.clear()
        tails = [self.tails[k] for k in keys]
        lengths = np.fromiter((len(v) for _, v in tails), dtype=np.int32, count=len(tails))
        offsets = np.zeros(len(tails) + 1, dtype=np.int32)
        np.cumsum(lengths, out=offsets[1:])
        values = np.concatenate([v for _, v in tails]) if tails else np.zeros(0, dtype=np.int64)
        return pa.table({"key": pa.array(keys, pa.int64()), "day": pa.array([d for d, _ in tails], pa.int64()),
                         "values": pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, pa.int64()))})

    def load(self, changes: pa.Table) -> None:
        """Apply a `take_changes()` table (restore)."""
        col = changes.column("values").combine_chunks()
        offsets = col.offsets.to_numpy()
        flat = col.values.to_numpy()
        tails = [flat[offsets[i]:offsets[i + 1]].copy() for i in range(len(col))]
        self.tails.update(zip(changes.column("key").to_pylist(), zip(changes.column("day").to_pylist(), tails)))

    def forget_before(self, day: int) -> None:
        """Drop tails of days before `day` (they can no longer be extended)."""
        for key in [k for k, (d, _) in self.tails.items() if d < day]:
            del self.tails[key]


def label_values(spec: Spec, events: pa.Table) -> pa.Array:
    """The label of a `column` or `rule` label as int32 (0/1)."""
    lab = spec.label
    col = events.column(lab.field or "")
    if lab.kind == "column":
        x = pc.cast(col, pa.float64())
        out = pc.not_equal(x, 0.0)
    else:
        x = pc.cast(col, pa.float64())
        ops = {">=": pc.greater_equal, "<=": pc.less_equal, ">": pc.greater, "<": pc.less,
               "==": pc.equal, "!=": pc.not_equal}
        out = ops[lab.op or "=="](x, lab.value)
    return pc.cast(pc.fill_null(out, False), pa.int32()).combine_chunks() if isinstance(out, pa.ChunkedArray) \
        else pc.cast(pc.fill_null(out, False), pa.int32())


class Featurizer:
    """Raw events -> samples, the spec's way (see the module docstring). One per task or joiner:
    it holds the hash cache and the sequences' carried tails."""

    def __init__(self, spec: Spec, tables: Mapping[str, pa.Table] | None = None, *, keyed: bool = False) -> None:
        """`keyed`: sequences keep every key's tail between batches (`KeyedSequenceState`, the
        joiner), instead of only the last key's (`SequenceHistory`, Spark's sorted tasks)."""
        self.spec = spec
        self.tables = dict(tables or {})
        self.schema = sample_arrow_schema(spec)
        self._cache: dict[str, int] = {}
        kind = KeyedSequenceState if keyed else SequenceHistory
        self._history = {f.name: kind(f.length) for f in spec.features if f.kind == "sequence"}

    @property
    def sequences(self) -> dict[str, SequenceHistory | KeyedSequenceState]:
        """Each sequence feature's history (the joiner saves and restores the keyed ones)."""
        return self._history

    def samples(self, events: pa.Table) -> pa.Table:
        """`events`: the events source's fields (required ones present), `sample_id` when already
        computed, and `label` for a click-within label. Rows must be sorted by each sequence's
        (per, time, sample_id) when the spec has sequences. Returns the sample columns."""
        spec = self.spec
        ev_name = spec.events.name
        missing = _absent_values(spec, events)
        events = fill_defaults(spec, ev_name, events)
        if SAMPLE_ID not in events.column_names:
            events = events.append_column(SAMPLE_ID, sample_ids(spec, events))
        events = join_tables(spec, events, self.tables, missing)
        time_col = pc.cast(events.column(spec.events.time or ""), pa.timestamp("us", tz="UTC"))
        out: dict[str, pa.Array | pa.ChunkedArray] = {SAMPLE_ID: pc.cast(events.column(SAMPLE_ID), pa.string()),
                                                      EVENT_TIME: time_col}
        time_us = pc.cast(time_col, pa.int64()).to_numpy(zero_copy_only=False)
        for f in spec.features:
            if f.indicator_of is not None:
                out[f.name] = pc.cast(missing[f.field], pa.float32())
                continue
            col = events.column(f.field)
            if f.kind == "dense":
                out[f.name] = pa.array(dense_values(f, col), pa.float32())
            elif f.kind in ("id", "categorical"):
                out[f.name] = pa.array(sparse_values(col, self._cache, hash_all=f.kind == "categorical"), pa.int64())
            elif f.kind == "list":
                out[f.name] = list_values(f, col, self._cache, hash_all=not _shares_raw_ids(spec, f))
            else:
                keys = sparse_values(events.column(f.per or ""), self._cache, hash_all=False)
                vals = sparse_values(col, self._cache, hash_all=not _shares_raw_ids(spec, f))
                out[f.name] = self._history[f.name](keys, time_us // US_PER_DAY, vals)
        out[LABEL] = events.column(LABEL) if spec.label.kind == "click_within" else label_values(spec, events)
        arrays = [pc.cast(out[name], self.schema.field(name).type) for name in self.schema.names]
        return pa.Table.from_arrays(arrays, schema=self.schema)

    def batches(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """For `mapInArrow`: each batch of raw events -> one batch of samples."""
        for batch in batches:
            if batch.num_rows:
                yield from self.samples(pa.Table.from_batches([batch])).to_batches()


def _absent_values(spec: Spec, events: pa.Table) -> dict[str, pa.Array]:
    """events field -> where its value is absent, for the events fields an indicator reads (the
    column missing altogether: absent everywhere). Side-table fields are added by `join_tables`."""
    out: dict[str, pa.Array] = {}
    for f in spec.features:
        if f.indicator_of is not None and f.table is None and f.field not in out:
            if f.field in events.column_names:
                col = events.column(f.field)
                out[f.field] = pc.is_null(col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col)
            else:
                out[f.field] = pa.array(np.ones(events.num_rows, dtype=bool))
    return out


def _shares_raw_ids(spec: Spec, f: FeatureSpec) -> bool:
    """Whether a list/sequence embeds its values as raw integer ids: it shares an id feature's
    table (an item id in a history is the same row as the item id itself)."""
    return f.shares is not None and spec.feature(f.shares).kind == "id"
