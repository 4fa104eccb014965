"""Reading the raw zone into Spark: file listing through Spark's own filesystem layer, and
JSON lines or Parquet read with the explicit schema of the spec's source.

Malformed JSON lines are kept (PERMISSIVE mode) with the line in `_corrupt_record`, and every
row carries the file it came from and where in it, so validation can send bad records to
`samples_rejects` with their file and line. JSON lines are read as text and parsed with the
source's schema (blank lines are no records but count as lines); a row's place is its position
in the file split that read it (`_line_pos`, `_block`: the split's first byte), turned into the
file's line by `line_offsets` (splits before it, counted only when there are rejects). Parquet
rows carry their row index (`_block` null).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import pyarrow as pa
from pyspark.sql import Column, DataFrame, DataFrameReader, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from slipstream.errors import PreprocessError
from slipstream.lake.raw_zone import raw_format
from slipstream.samples.schema import source_arrow_schema
from slipstream.samples.spec import SourceSpec

log = logging.getLogger(__name__)

CORRUPT = "_corrupt_record"
SOURCE = "_source_file"
LINE_POS = "_line_pos"
"""JSON: the row's position id within its split (monotonic); Parquet: its row index in the file."""
BLOCK = "_block"
"""JSON: the first byte of the split that read the row; Parquet: null."""

_SPARK_TYPES: dict[pa.DataType, T.DataType] = {
    pa.string(): T.StringType(),
    pa.int64(): T.LongType(),
    pa.int32(): T.IntegerType(),
    pa.float64(): T.DoubleType(),
    pa.float32(): T.FloatType(),
    pa.bool_(): T.BooleanType(),
    pa.timestamp("us", tz="UTC"): T.TimestampType(),
}


def _spark_type(t: pa.DataType) -> T.DataType:
    if pa.types.is_list(t):
        return T.ArrayType(_spark_type(t.value_type), containsNull=True)
    return _SPARK_TYPES[t]


def arrow_to_spark(schema: pa.Schema) -> T.StructType:
    """The Spark schema of an Arrow schema (Spark's TimestampType is UTC-adjusted)."""
    return T.StructType([T.StructField(f.name, _spark_type(f.type), nullable=True) for f in schema])


def spark_schema(source: SourceSpec) -> T.StructType:
    """The Spark schema of a spec source's fields."""
    return arrow_to_spark(source_arrow_schema(source))


def list_raw_files(spark: SparkSession, dirs: Iterable[str]) -> list[str]:
    """Data files under `dirs` (recursively), through the Hadoop filesystem Spark reads with, so
    the listing sees exactly what Spark can open (file:, s3a:, hdfs: ...). A missing folder is
    an empty one."""
    jvm = spark.sparkContext._jvm
    if jvm is None:
        raise PreprocessError("listing raw files needs a Spark session with a JVM driver (not Spark Connect)")
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    out: list[str] = []
    for d in dirs:
        path = jvm.org.apache.hadoop.fs.Path(d)
        fs = path.getFileSystem(conf)
        if not fs.exists(path):
            continue
        it = fs.listFiles(path, True)
        while it.hasNext():
            name = it.next().getPath().toString()
            if raw_format(name) is not None:
                out.append(name)
    return sorted(out)


GLOBS = {"json": "*.{jsonl,jsonl.gz,json,json.gz}", "parquet": "*.parquet"}
"""File names each reader takes from a folder (`raw_format`'s suffixes; Spark itself skips `_…` and `.…`)."""


def _text_reader(spark: SparkSession, folders: bool) -> DataFrameReader:
    """The text reader of JSON lines: of files, or (`folders`) of whole folders, recursively,
    keeping the names `raw_format` reads as JSON."""
    reader = spark.read
    if folders:
        reader = reader.option("recursiveFileLookup", "true").option("pathGlobFilter", GLOBS["json"])
    return reader


def _json_lines(spark: SparkSession, paths: list[str], folders: bool = False) -> DataFrame:
    """Every line of `paths` (blank ones too) with its file, split and position in the split (as
    `read_raw` numbers them: straight off the scan, every line the split read, in order)."""
    return _text_reader(spark, folders).text(paths).select(
        F.col("value"), F.input_file_name().alias(SOURCE), F.col("_metadata.file_block_start").alias(BLOCK),
        F.monotonically_increasing_id().alias(LINE_POS),
    )


def line_offsets(spark: SparkSession, files: list[str], folders: bool = False) -> dict[str, int]:
    """Per JSON file split (`split_key`): what to add to a row's position in it to get its line in
    the file (the lines of the file's earlier splits, less the split's first position, plus 1).
    One aggregate over the files, run only where rows were rejected; a few entries per file.
    `files` must be what the rows were read from, as they were read (`folders`: the JSON folders
    `read_raw_folders` read): the same read gives the same splits and positions."""
    json_paths = files if folders else [f for f in files if raw_format(f) == "json"]
    if not json_paths:
        return {}
    splits = (_json_lines(spark, json_paths, folders).groupBy(SOURCE, BLOCK)
              .agg(F.count(F.lit(1)).alias("n"), F.min(LINE_POS).alias("first_pos")).collect())
    out: dict[str, int] = {}
    before: dict[str, int] = {}
    for r in sorted(splits, key=lambda r: (r[SOURCE], r[BLOCK])):
        done = before.get(r[SOURCE], 0)
        out[f"{r[SOURCE]}#{r[BLOCK]}"] = done - int(r["first_pos"]) + 1
        before[r[SOURCE]] = done + int(r["n"])
    return out


def split_key() -> Column:
    """A row's file split as `line_offsets` names it."""
    return F.concat_ws("#", F.col(SOURCE), F.col(BLOCK).cast("string"))


def _json_records(lines: DataFrame, schema: T.StructType) -> DataFrame:
    """The records of `_json_lines` parsed with `schema` (blank lines dropped), in `read_raw`'s
    columns. The parsed record and the (nondeterministic) position share ONE struct: the optimizer
    then neither pushes a later filter below the parse nor inlines it, so each line is parsed once
    (a deterministic from_json would be copied into every check that names a field)."""
    with_corrupt = T.StructType([*schema.fields, T.StructField(CORRUPT, T.StringType())])
    options = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT}
    parsed = lines.select(F.col("value"), SOURCE, BLOCK,
                          F.struct(F.from_json(F.col("value"), with_corrupt, options).alias("j"),
                                   F.col(LINE_POS).alias("pos")).alias("_r"))
    return (parsed.where(F.trim(F.col("value")) != "")
            .select(*[F.col(f"_r.j.{n}").alias(n) for n in with_corrupt.fieldNames()], SOURCE,
                    F.col("_r.pos").alias(LINE_POS), BLOCK))


def _empty(spark: SparkSession, schema: T.StructType) -> DataFrame:
    return spark.createDataFrame([], T.StructType([
        *schema.fields, T.StructField(CORRUPT, T.StringType()), T.StructField(SOURCE, T.StringType()),
        T.StructField(LINE_POS, T.LongType()), T.StructField(BLOCK, T.LongType())]))


def read_raw(spark: SparkSession, files: list[str], schema: T.StructType) -> DataFrame:
    """Rows of `files` with `schema` plus `_corrupt_record` (the raw line of a JSON record that
    did not parse into the schema; null otherwise), `_source_file` and the row's place in it
    (`_line_pos`, `_block`)."""
    out_cols = [*schema.fieldNames(), CORRUPT, SOURCE, LINE_POS, BLOCK]
    parts: list[DataFrame] = []
    json_files = [f for f in files if raw_format(f) == "json"]
    parquet_files = [f for f in files if raw_format(f) == "parquet"]
    if json_files:
        parts.append(_json_records(_json_lines(spark, json_files), schema))
    if parquet_files:
        # A column missing from a file reads as nulls here; validation turns that into a
        # schema-drift error naming the file.
        df = spark.read.schema(schema).parquet(*parquet_files)
        parts.append(
            df.withColumn(CORRUPT, F.lit(None).cast(T.StringType()))
            .withColumn(SOURCE, F.input_file_name())
            .withColumn(LINE_POS, F.col("_metadata.row_index"))
            .withColumn(BLOCK, F.lit(None).cast(T.LongType()))
            .select(*out_cols)
        )
    if not parts:
        return _empty(spark, schema)
    result = parts[0]
    for p in parts[1:]:
        result = result.unionByName(p)
    return result


def read_raw_folders(spark: SparkSession, folders: dict[str, list[str]], schema: T.StructType) -> DataFrame:
    """`read_raw` of whole folders, by format (`json`/`parquet` -> folders holding such files):
    Spark lists them itself (no per-file path checks, which cost ~5 ms a file on a local disk),
    recursively, keeping the names `raw_format` reads. Rows carry their place as `read_raw`'s do
    (`line_offsets(spark, folders["json"], folders=True)` for the JSON lines)."""
    out_cols = [*schema.fieldNames(), CORRUPT, SOURCE, LINE_POS, BLOCK]
    parts: list[DataFrame] = []
    if folders.get("json"):
        parts.append(_json_records(_json_lines(spark, folders["json"], folders=True), schema).select(*out_cols))
    if folders.get("parquet"):
        df = (spark.read.schema(schema).option("recursiveFileLookup", "true").option("pathGlobFilter", GLOBS["parquet"])
              .parquet(*folders["parquet"]))
        parts.append(df.withColumn(CORRUPT, F.lit(None).cast(T.StringType())).withColumn(SOURCE, F.input_file_name())
                     .withColumn(LINE_POS, F.col("_metadata.row_index")).withColumn(BLOCK, F.lit(None).cast(T.LongType()))
                     .select(*out_cols))
    if not parts:
        return _empty(spark, schema)
    result = parts[0]
    for p in parts[1:]:
        result = result.unionByName(p)
    return result
