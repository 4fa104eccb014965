"""Reading the raw zone into Spark: file listing through Spark's own filesystem layer, and
JSON lines or Parquet read with the explicit schema of the spec's source.

Malformed JSON lines are kept (PERMISSIVE mode) with the line in `_corrupt_record`, and every
row carries the file it came from, so validation can send bad records to `samples_rejects`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from slipstream.lake.raw_zone import raw_format
from slipstream.samples.schema import source_arrow_schema
from slipstream.samples.spec import SourceSpec

log = logging.getLogger(__name__)

CORRUPT = "_corrupt_record"
SOURCE = "_source_file"

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


def read_raw(spark: SparkSession, files: list[str], schema: T.StructType) -> DataFrame:
    """Rows of `files` with `schema` plus `_corrupt_record` (the raw line of a JSON record that
    did not parse into the schema; null otherwise) and `_source_file`."""
    out_cols = [*schema.fieldNames(), CORRUPT, SOURCE]
    parts: list[DataFrame] = []
    json_files = [f for f in files if raw_format(f) == "json"]
    parquet_files = [f for f in files if raw_format(f) == "parquet"]
    if json_files:
        with_corrupt = T.StructType([*schema.fields, T.StructField(CORRUPT, T.StringType())])
        df = (
            spark.read.schema(with_corrupt)
            .option("mode", "PERMISSIVE")
            .option("columnNameOfCorruptRecord", CORRUPT)
            .json(json_files)
        )
        parts.append(df.withColumn(SOURCE, F.input_file_name()).select(*out_cols))
    if parquet_files:
        # A column missing from a file reads as nulls here; validation turns that into a
        # schema-drift error naming the file.
        df = spark.read.schema(schema).parquet(*parquet_files)
        parts.append(
            df.withColumn(CORRUPT, F.lit(None).cast(T.StringType()))
            .withColumn(SOURCE, F.input_file_name())
            .select(*out_cols)
        )
    if not parts:
        empty = T.StructType([*schema.fields, T.StructField(CORRUPT, T.StringType()), T.StructField(SOURCE, T.StringType())])
        return spark.createDataFrame([], empty)
    result = parts[0]
    for p in parts[1:]:
        result = result.unionByName(p)
    return result


GLOBS = {"json": "*.{jsonl,jsonl.gz,json,json.gz}", "parquet": "*.parquet"}
"""File names each reader takes from a folder (`raw_format`'s suffixes; Spark itself skips `_…` and `.…`)."""


def read_raw_folders(spark: SparkSession, folders: dict[str, list[str]], schema: T.StructType) -> DataFrame:
    """`read_raw` of whole folders, by format (`json`/`parquet` -> folders holding such files):
    Spark lists them itself (no per-file path checks, which cost ~5 ms a file on a local disk),
    recursively, keeping the names `raw_format` reads."""
    out_cols = [*schema.fieldNames(), CORRUPT, SOURCE]
    parts: list[DataFrame] = []
    if folders.get("json"):
        with_corrupt = T.StructType([*schema.fields, T.StructField(CORRUPT, T.StringType())])
        df = (spark.read.schema(with_corrupt).option("mode", "PERMISSIVE").option("columnNameOfCorruptRecord", CORRUPT)
              .option("recursiveFileLookup", "true").option("pathGlobFilter", GLOBS["json"]).json(folders["json"]))
        parts.append(df.withColumn(SOURCE, F.input_file_name()).select(*out_cols))
    if folders.get("parquet"):
        df = (spark.read.schema(schema).option("recursiveFileLookup", "true").option("pathGlobFilter", GLOBS["parquet"])
              .parquet(*folders["parquet"]))
        parts.append(df.withColumn(CORRUPT, F.lit(None).cast(T.StringType())).withColumn(SOURCE, F.input_file_name())
                     .select(*out_cols))
    if not parts:
        empty = T.StructType([*schema.fields, T.StructField(CORRUPT, T.StringType()), T.StructField(SOURCE, T.StringType())])
        return spark.createDataFrame([], empty)
    result = parts[0]
    for p in parts[1:]:
        result = result.unionByName(p)
    return result
