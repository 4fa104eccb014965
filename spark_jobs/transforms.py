"""Pure DataFrame -> DataFrame steps of the preprocessing job, for any feature spec: validation of
raw records into rejects, the sample id, click attribution and dedupe, and the order the writer's
tasks need. No I/O here, so each step is testable on rows made by hand.

The features themselves are NOT computed here: the writer's `mapInArrow` tasks run the spec's
Arrow-level featurizer (`slipstream.samples.transform.Featurizer`, through
`spark_jobs.finisher.SampleFinisher`), the same code the stream joiner and the generator run, so
batch and stream samples cannot disagree.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, date, datetime, timedelta

import pyarrow as pa
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from slipstream.samples.spec import LABEL, SAMPLE_ID, SourceSpec, Spec
from spark_jobs.raw_input import BLOCK, CORRUPT, LINE_POS, SOURCE, spark_schema, split_key

REASON = "_reject_reason"
US_PER_S = 1_000_000


def _day_bounds(day: date) -> tuple[datetime, datetime]:
    start = datetime(day.year, day.month, day.day, tzinfo=UTC)
    return start, start + timedelta(days=1)


def _corrupt_reason(schema: T.StructType) -> Column:
    """Why a line landed in `_corrupt_record`: the fields whose value has the wrong type (found by
    re-reading the line with every field as a string), else a malformed line."""
    as_text = F.from_json(F.col(CORRUPT), T.StructType([T.StructField(n, T.StringType()) for n in schema.fieldNames()]))
    wrong = F.concat_ws(
        ", ",
        *[
            F.when(as_text[n].isNotNull() & F.col(n).isNull(), F.concat(F.lit(f"{n}="), F.substring(as_text[n], 1, 40)))
            for n in schema.fieldNames()
        ],
    )
    return F.when(wrong != "", F.concat(F.lit("wrong type: "), wrong)).otherwise(
        F.lit("malformed line: not a JSON object with the expected fields")
    )


def _first_reason(checks: list[tuple[Column, Column]]) -> Column:
    expr: Column | None = None
    for cond, reason in checks:
        expr = F.when(cond, reason) if expr is None else expr.when(cond, reason)
    assert expr is not None
    return expr


def classify(raw: DataFrame, source: SourceSpec, day: date | Column | None = None) -> DataFrame:
    """`raw` (the source's fields + `_corrupt_record` + `_source_file`) with `_reject_reason`: null
    for a good record, else the first problem found (malformed line, wrong type, a missing
    required field, a NaN/infinite number, with `day`: a time outside the day; a date column:
    each row's own day, as in a range job). A missing optional field is no problem: the
    featurizer gives it its default."""
    schema = spark_schema(source)
    checks: list[tuple[Column, Column]] = [(F.col(CORRUPT).isNotNull(), _corrupt_reason(schema))]
    checks += [(F.col(n).isNull(), F.lit(f"missing field {n}")) for n in source.required]
    for f in schema.fields:
        if isinstance(f.dataType, (T.DoubleType, T.FloatType)):
            c = F.col(f.name)
            checks.append((F.isnan(c) | (F.abs(c) == float("inf")), F.lit(f"{f.name} is NaN or infinite")))
    if isinstance(day, Column) and source.time:
        ts = F.col(source.time)
        checks.append((
            F.to_date(ts) != day,  # the session time zone is UTC
            F.concat(F.lit(f"{source.time} "), F.date_format(ts, "yyyy-MM-dd'T'HH:mm:ss.SSSSSSX"), F.lit(" outside day "),
                     F.date_format(day, "yyyy-MM-dd")),
        ))
    elif isinstance(day, date) and source.time:
        start, end = _day_bounds(day)
        ts = F.col(source.time)
        checks.append((
            (ts < F.lit(start)) | (ts >= F.lit(end)),
            F.concat(F.lit(f"{source.time} "), F.date_format(ts, "yyyy-MM-dd'T'HH:mm:ss.SSSSSSX"), F.lit(f" outside day {day}")),
        ))
    return raw.withColumn(REASON, _first_reason(checks))


def good(classified: DataFrame) -> DataFrame:
    return classified.where(F.col(REASON).isNull()).drop(REASON, CORRUPT, SOURCE, LINE_POS, BLOCK)


def rejects(classified: DataFrame, day: date | Column, run_id: str, source: SourceSpec,
            offsets: Mapping[str, int] | None = None) -> DataFrame:
    """Rejected records in the `samples_rejects` layout; `raw_line` is the line as read when it
    did not parse, else the parsed fields as JSON (NaN shows as NaN); `line` its line in
    `source_file` (Parquet: the row), from `offsets` (`raw_input.line_offsets`) for JSON files.
    `day`: the day read, or a date column (a range job: each record's folder day).
    The offsets are a literal map, not a join: a join would make the optimizer derive constraints
    from every field's expression (it does not finish for a source with 40 fields)."""
    in_json: Column = F.lit(None).cast("long")
    if offsets:
        lookup = F.create_map(*[F.lit(x) for k, v in offsets.items() for x in (k, v)])
        in_json = F.col(LINE_POS) + F.element_at(lookup, split_key())
    return classified.where(F.col(REASON).isNotNull()).select(
        (day if isinstance(day, Column) else F.lit(day)).alias("day"),
        F.lit(run_id).alias("run_id"),
        F.lit(source.name).alias("record_kind"),
        F.col(SOURCE).alias("source_file"),
        F.col(REASON).alias("reason"),
        F.coalesce(F.col(CORRUPT), F.to_json(F.struct(*source.field_names))).alias("raw_line"),
        F.when(F.col(BLOCK).isNull(), F.col(LINE_POS) + 1).otherwise(in_json).cast("long").alias("line"),
    )


def file_stats(classified: DataFrame, source: SourceSpec) -> DataFrame:
    """Per source file and reject reason: record count and how many records parsed as JSON."""
    parsed = F.col(CORRUPT).isNull()
    return classified.groupBy(SOURCE, REASON).agg(
        F.count(F.lit(1)).alias("records"), F.sum(parsed.cast("long")).alias("parsed")
    ).withColumn("record_kind", F.lit(source.name))


def with_sample_id(events: DataFrame, spec: Spec) -> DataFrame:
    """Good events with `sample_id`: the id field as text, or the spec's hash of the id fields,
    computed by the same Arrow function every other path uses (`transform.sample_ids`)."""
    rule = spec.events.id
    if isinstance(rule, str):
        return events.withColumn(SAMPLE_ID, F.col(rule).cast("string"))

    def add_ids(batches):  # type: ignore[no-untyped-def]
        from slipstream.samples.transform import sample_ids

        for batch in batches:
            table = pa.Table.from_batches([batch])
            yield from table.append_column(SAMPLE_ID, sample_ids(spec, table)).to_batches()

    out_schema = T.StructType([*events.schema.fields, T.StructField(SAMPLE_ID, T.StringType())])
    return events.mapInArrow(add_ids, out_schema)


def sort_key(spec: Spec) -> str:
    """What the writer's tasks are partitioned and sorted by: the sequences' key (their history
    is per key), else the sample id."""
    pers = {f.per for f in spec.features if f.kind == "sequence" and f.per is not None}  # load_spec requires per
    return pers.pop() if pers else SAMPLE_ID


def finisher_columns(spec: Spec) -> list[str]:
    """What the writer's tasks get: the events' fields, the sample id, and a click label."""
    cols = [*spec.events.field_names, SAMPLE_ID]
    return [*cols, LABEL] if spec.label.kind == "click_within" else cols


def _clicked(event_time: Column, window_s: int) -> Column:
    """Whether the array column `clicks` holds a click 0..`window_s` seconds after `event_time`."""
    t0 = F.unix_micros(event_time)
    return F.exists(
        "clicks", lambda c: (F.unix_micros(c) >= t0) & (F.unix_micros(c) - t0 <= F.lit(window_s * US_PER_S))
    )


def label_each_row(events: DataFrame, labels: DataFrame, spec: Spec) -> DataFrame:
    """Click-within specs: `events` with `label` = 1 when a labels record on the row's sample id
    happened within the window after the row's own time. No dedupe: each copy of a duplicated
    event is labelled against its own time, so the copy that wins the dedupe carries the label
    `dedupe_and_label` gives it. Labels are grouped per id first (small next to the events), then
    left-joined: Spark broadcasts them when they are small, so the events are not shuffled by id."""
    src, lab = spec.label_source, spec.label
    assert src is not None and src.key and src.time
    per_id = labels.groupBy(F.col(src.key).alias(SAMPLE_ID)).agg(F.collect_list(src.time).alias("clicks"))
    joined = events.join(per_id, on=SAMPLE_ID, how="left")
    label = F.coalesce(_clicked(F.col(spec.events.time or ""), lab.window_s), F.lit(False)).cast("int")
    return joined.select(*events.columns, label.alias(LABEL))


def dedupe_and_label(events: DataFrame, labels: DataFrame | None, spec: Spec, by_day: str = "") -> DataFrame:
    """One row per sample id (with a click label for click-within specs), in ONE shuffle (a
    cogroup of events and labels by id). Among differing copies the smallest row, compared field
    by field in the events source's order from its time on, wins, so reruns pick the same one.
    `by_day`: the events' date column in a range job: one row per (day, id), as day by day (a
    day's labels are every labels record on its ids, which the window check then narrows)."""
    time = spec.events.time or ""
    skip = (SAMPLE_ID, time, by_day)
    value_cols = [time, *(c for c in events.columns if c not in skip)]
    keys = [SAMPLE_ID, by_day] if by_day else [SAMPLE_ID]
    rows = events.select(*keys, F.struct(*value_cols).alias("row"), F.lit(None).cast("timestamp").alias("click_ts"))
    src = spec.label_source
    if labels is not None and src is not None:
        clk = labels.select(F.col(src.key or "").alias(SAMPLE_ID), F.lit(None).cast(rows.schema["row"].dataType).alias("row"),
                            F.col(src.time or "").alias("click_ts"))
        if by_day:  # every day's copy of an id sees the id's labels: pair them by id first
            clk = clk.join(events.select(SAMPLE_ID, by_day).distinct(), on=SAMPLE_ID).select(*keys, "row", "click_ts")
        rows = rows.unionByName(clk)
    grouped = (rows.groupBy(*keys).agg(F.min("row").alias("row"), F.collect_list("click_ts").alias("clicks"))
               .where(F.col("row").isNotNull()))
    out: list[Column | str] = [*keys, *(F.col(f"row.{c}").alias(c) for c in value_cols)]
    if spec.label.kind == "click_within":
        out.append(_clicked(F.col(f"row.{time}"), spec.label.window_s).cast("int").alias(LABEL))
    return grouped.select(*out)


def one_shuffle_rows(events: DataFrame, labels: DataFrame | None, spec: Spec) -> DataFrame:
    """The writer's input NOT deduped, in one shuffle: rows labelled each on their own, partitioned
    by `sort_key` and sorted by (key, time, sample id, then the other fields in `dedupe_and_label`'s
    order). Copies of an event with the same key and time sit side by side with the smallest
    first, which is the copy `dedupe_and_label` keeps: the writer drops the ones after it
    (`SampleFinisher(dedupe=True)`). Copies it cannot see that way (other keys or times) stay;
    the job finds them in the written files and falls back to `exact_rows`."""
    if spec.label.kind == "click_within" and labels is not None:
        events = label_each_row(events, labels, spec)
    key, time = sort_key(spec), spec.events.time or ""
    first = list(dict.fromkeys([key, time, SAMPLE_ID]))
    rest = [c for c in spec.events.field_names if c not in first]
    ordered = events.repartition(key).sortWithinPartitions(*first, *rest)
    return ordered.select(*finisher_columns(spec))


def exact_rows(events: DataFrame, labels: DataFrame | None, spec: Spec) -> DataFrame:
    """The writer's input deduped by id (`dedupe_and_label`), partitioned and sorted like
    `one_shuffle_rows`."""
    key, time = sort_key(spec), spec.events.time or ""
    deduped = dedupe_and_label(events, labels, spec)
    ordered = deduped.repartition(key).sortWithinPartitions(*dict.fromkeys([key, time, SAMPLE_ID]))
    return ordered.select(*finisher_columns(spec))


def rejects_of(classified: dict[str, DataFrame], spec: Spec, day: date, run_id: str,
               offsets: Mapping[str, Mapping[str, int]] | None = None) -> DataFrame:
    """The rejects of every source read for the day, in one DataFrame; `offsets`: per source, its
    JSON files' `line_offsets`."""
    parts = [rejects(df, day, run_id, spec.source(name), (offsets or {}).get(name)) for name, df in classified.items()]
    out = parts[0]
    for p in parts[1:]:
        out = out.unionByName(p)
    return out


def stats_of(classified: dict[str, DataFrame], spec: Spec) -> DataFrame:
    """file_stats of every source in one DataFrame (one action computes them)."""
    parts = [file_stats(df, spec.source(name)) for name, df in classified.items()]
    out = parts[0]
    for p in parts[1:]:
        out = out.unionByName(p)
    return out


def range_rows(events: DataFrame, labels: DataFrame | None, spec: Spec, day: str, split_key: Column) -> DataFrame:
    """`one_shuffle_rows` for a range of days in ONE shuffle: rows partitioned by (day,
    `split_key`) and sorted by (day, key, time, sample id, the other fields), with the `day`
    column kept for the writer. `split_key` is a constant for a small day (all its rows in one
    task: one file per day) and the sort key for a large one (spread over the tasks like a day
    alone). The writer drops the adjacent copies of an event within a day."""
    if spec.label.kind == "click_within" and labels is not None:
        events = label_each_row(events, labels, spec)
    key, time = sort_key(spec), spec.events.time or ""
    first = list(dict.fromkeys([key, time, SAMPLE_ID]))
    rest = [c for c in spec.events.field_names if c not in first]
    ordered = events.repartition(F.col(day), split_key).sortWithinPartitions(day, *first, *rest)
    return ordered.select(*finisher_columns(spec), day)


def exact_range_rows(events: DataFrame, labels: DataFrame | None, spec: Spec, day: str, split_key: Column) -> DataFrame:
    """`exact_rows` for a range: deduped by (day, id), partitioned and sorted like `range_rows`."""
    key, time = sort_key(spec), spec.events.time or ""
    deduped = dedupe_and_label(events, labels, spec, by_day=day)
    ordered = deduped.repartition(F.col(day), split_key).sortWithinPartitions(
        day, *dict.fromkeys([key, time, SAMPLE_ID]))
    return ordered.select(*finisher_columns(spec), day)
