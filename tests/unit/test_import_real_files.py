"""`slipstream import` on real-looking files that used to lose or change data without an error
(tests/data/import: Avazu, Criteo and MovieLens layouts, hand-made): 64-bit ids stay exact, a time
is read the way the spec says (or refused with the format to declare), a file that yields no
record, misnames its columns or is cut short stops the import with nothing written, every event
of a `--stream-after` import lands in the raw zone, and a missing value stays visible."""

from __future__ import annotations

import copy
import gzip
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from slipstream.cli import main
from slipstream.lake.importer import ImportOptions, import_files
from slipstream.samples.spec import load_spec, spec_from_dict
from slipstream.samples.transform import Featurizer
from slipstream.settings import Settings

DATA = Path(__file__).resolve().parents[1] / "data" / "import"
AVAZU = DATA / "avazu"
UTC = UTC
BIG_IDS = ["10000169349117863715", "10000371904215119486", "10000640724480838376", "10000679056417042096",
           "10000720757801103869", "10000918755742328737", "10000949271186029916", "10001264480619467364"]
FITTING_IDS = ["1000009418151094273", "9223372036854775807", "1000011894040108031", "1000010000000000001"]


def _avazu(folder: Path, **field_changes: Any) -> Path:
    """The Avazu test spec with some fields of its source changed (None: its format dropped), as a file."""
    doc = yaml.safe_load((AVAZU / "avazu.yaml").read_text())
    for name, change in field_changes.items():
        if change is None:
            doc["sources"]["impressions"]["fields"][name].pop("format", None)
        else:
            doc["sources"]["impressions"]["fields"][name].update(change)
    return _spec_file(doc, folder / "avazu_variant.yaml")


def _spec_file(doc: dict[str, Any], path: Path) -> Path:
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _raw(settings: Settings, source: str) -> pa.Table:
    files = sorted((Path(settings.raw_dir) / source).rglob("*.parquet"))
    return pa.concat_tables([pq.read_table(f) for f in files]) if files else pa.table({})


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = main(["import", *args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_avazu_ids_beyond_and_within_int64_stay_exact(settings: Settings, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    # as text (`type: string`): every id exactly as written, also the ones beyond int64
    rc, out, _ = _run(capsys, "--json", "--spec", str(AVAZU / "avazu.yaml"), str(AVAZU / "train.csv"))
    assert rc == 0 and json.loads(out)["sources"]["impressions"]["imported"] == 12
    avazu = settings.for_dataset(str(AVAZU / "avazu.yaml"))  # the data set's own raw zone
    assert sorted(_raw(avazu, "impressions").column("id").to_pylist()) == sorted(BIG_IDS + FITTING_IDS)

    # as `type: long`: the ids beyond int64 are rejected quoting the text as written, and the ids
    # that fit are not changed by sharing a batch with them (they used to go through float64)
    variant = _avazu(tmp_path, id={"type": "long"})
    rc, out, _ = _run(capsys, "--json", "--spec", str(variant), str(AVAZU / "train.csv"))
    assert rc == 0
    report = json.loads(out)["sources"]["impressions"]
    assert (report["imported"], report["rejected"]) == (4, 8)
    ids = _raw(settings.for_dataset(str(variant)), "impressions").column("id").to_pylist()
    assert sorted(ids) == sorted(int(i) for i in FITTING_IDS)
    reasons = {r["line"]: r["reason"] for r in map(json.loads, Path(report["rejects_file"]).read_text().splitlines())}
    assert reasons[3] == ("field `id`: out of range for long (int64): '10000169349117863715' (declare the field "
                          "`type: string` to keep it as an id)")


def test_json_ids_next_to_floats_stay_exact(settings: Settings, tmp_path: Path) -> None:
    """A JSON-lines batch whose column mixes integers and floats used to become float64."""
    spec = spec_from_dict({**yaml.safe_load((AVAZU / "avazu.yaml").read_text())})
    doc = copy.deepcopy(dict(spec.raw))
    doc["sources"]["impressions"]["fields"]["C1"] = {"type": "string"}
    spec = spec_from_dict(doc)
    rows = [line.split(",") for line in (AVAZU / "train.csv").read_text().splitlines()]
    header, body = rows[0], rows[1:]
    f = tmp_path / "impressions.jsonl"
    with open(f, "w") as out:
        for i, r in enumerate(body):
            rec: dict[str, Any] = dict(zip(header, r))
            rec["id"] = rec["id"] if int(rec["id"]) > 2**63 - 1 else int(rec["id"])  # text beyond int64, else a number
            rec["C1"] = 1005.5 if i == 0 else 1000009418151094273  # a float next to 64-bit integers
            out.write(json.dumps(rec) + "\n")
    res = import_files(spec, [f], ImportOptions(raw_dir=Path(settings.raw_dir)))
    assert res.sources["impressions"].imported == 12
    got = _raw(settings, "impressions")
    assert sorted(got.column("id").to_pylist()) == sorted(BIG_IDS + FITTING_IDS)
    assert sorted(got.column("C1").to_pylist())[:2] == ["1000009418151094273", "1000009418151094273"]
    assert "1005.5" in got.column("C1").to_pylist()


def test_avazu_hour_is_read_with_its_declared_format(settings: Settings, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _run(capsys, "--json", "--spec", str(AVAZU / "avazu.yaml"), str(AVAZU / "train.csv"))
    assert rc == 0 and json.loads(out)["sources"]["impressions"]["days"] == ["2014-10-21", "2014-10-22"]
    hours = sorted(_raw(settings.for_dataset(str(AVAZU / "avazu.yaml")), "impressions").column("hour").to_pylist())
    assert hours[0] == datetime(2014, 10, 21, 0, tzinfo=UTC) and hours[-1] == datetime(2014, 10, 22, 23, tzinfo=UTC)


def test_an_undeclared_numeric_time_out_of_range_is_refused_naming_the_format(settings: Settings, tmp_path: Path,
                                                                               capsys: pytest.CaptureFixture[str]) -> None:
    variant = _avazu(tmp_path, hour=None)
    rc, _, err = _run(capsys, "--spec", str(variant), str(AVAZU / "train.csv"))
    assert rc == 2 and "Traceback" not in err
    assert f"all 12 rows of {AVAZU / 'train.csv'} rejected: field `hour` not a plausible epoch time" in err
    assert "'14102100' (as epoch seconds 1970-06-13T05:15:00Z): declare the field's format, e.g. `format: '%y%m%d%H'` " \
           "(reads it as 2014-10-21T00:00:00Z)" in err
    assert not (Path(settings.for_dataset(str(variant)).raw_dir) / "impressions").exists()  # nothing imported into 1970


def test_movielens_epoch_seconds_and_milliseconds_still_read_without_a_format(settings: Settings) -> None:
    spec = load_spec("ratings")
    res = import_files(spec, [DATA / "ratings" / "ratings.csv"], ImportOptions(raw_dir=Path(settings.raw_dir)))
    assert res.sources["ratings"].imported == 7 and res.sources["ratings"].days[0] == "2026-11-01"


def test_a_comma_file_read_as_tsv_fails_naming_the_separator(settings: Settings, capsys: pytest.CaptureFixture[str]) -> None:
    f = DATA / "criteo" / "day_0_comma.txt"
    rc, _, err = _run(capsys, "--spec", "criteo", "--day", "2026-11-01", str(f))
    assert rc == 2 and "Traceback" not in err
    assert f"all 6 rows of {f} rejected: malformed line in 6 records (1 column per line, the spec expects 40: is the " \
           "separator `,` (csv)?" in err
    assert "First bad lines: line 1: malformed line: 1 column, expected 40; also lines 2, 3." in err
    assert not (Path(settings.for_dataset("criteo").raw_dir) / "displays").exists()


def _criteo_with_header(folder: Path) -> Path:
    doc = yaml.safe_load((Path(__file__).resolve().parents[2] / "specs" / "criteo.yaml").read_text())
    src = doc["sources"]["displays"]
    src.update(format="csv", header=True)
    del src["columns"]
    return _spec_file(doc, folder / "criteo_csv.yaml")


def test_misnamed_optional_columns_are_refused_with_a_did_you_mean(settings: Settings, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    spec, f = str(_criteo_with_header(tmp_path)), str(DATA / "criteo" / "day_1_header.csv")
    rc, _, err = _run(capsys, "--spec", spec, "--day", "2026-11-02", f)
    assert rc == 2 and "Traceback" not in err
    assert "`I1` (did you mean `i1`?)" in err and "`I13` (did you mean `i13`?)" in err and "--allow-missing FIELD" in err
    assert not (Path(settings.for_dataset(spec).raw_dir) / "displays").exists()

    # told that they are truly absent: imported, and the summary says every record took the default
    rc, out, _ = _run(capsys, "--json", "--spec", spec, "--day", "2026-11-02", "--allow-missing", "I1,I2,I3,I4,I5,I6",
                      "--allow-missing", "I7,I8,I9,I10,I11,I12,I13", f)
    assert rc == 0
    report = json.loads(out)["sources"]["displays"]
    assert report["imported"] == 3 and report["absent_fields"] == {f: [f"I{i}" for i in range(1, 14)]}
    rc, _, err = _run(capsys, "--spec", spec, "--day", "2026-11-02", "--allow-missing", "C1x", f)
    assert rc == 2 and "--allow-missing C1x: not an optional field of displays" in err


def test_a_truncated_gzip_refuses_the_whole_import(settings: Settings, capsys: pytest.CaptureFixture[str]) -> None:
    raw = Path(settings.for_dataset("criteo").raw_dir)
    # Criteo with --day: the records are counted first, and the cut file stops that
    cut, good = DATA / "criteo" / "day_3_truncated.txt.gz", DATA / "criteo" / "day_2.txt"
    rc, _, err = _run(capsys, "--spec", "criteo", "--day", "2026-11-05", str(good), str(cut))
    assert rc == 2 and "Traceback" not in err and "EOFError" not in err
    assert f"{cut} is truncated: its gzip stream ends before the end-of-stream marker" in err and "Nothing was imported" in err
    assert not (raw / "displays").exists()

    # JSON lines: the good file is read (and staged) first, the cut one fails half-way: still nothing lands
    cut, good = DATA / "synthetic" / "impressions_truncated.jsonl.gz", DATA / "synthetic" / "impressions.jsonl"
    rc, _, err = _run(capsys, str(good), str(cut), str(DATA / "synthetic" / "clicks.jsonl"))
    assert rc == 2 and "Traceback" not in err
    raw = Path(settings.raw_dir)  # no --spec: the default data set's raw zone
    assert f"{cut} is truncated: its gzip stream ends before the end-of-stream marker after line " in err
    assert not (raw / "impressions").exists() and not (raw / "clicks").exists() and not list(raw.glob("**/_new-*"))


def test_the_gzip_error_names_the_line_reached(settings: Settings, tmp_path: Path) -> None:
    data = (DATA / "criteo" / "day_0.txt").read_bytes() * 400
    f = tmp_path / "day_4.txt.gz"
    f.write_bytes(gzip.compress(data)[:-40])
    with pytest.raises(Exception, match=r"is truncated: .* after line [0-9,]+: the file was cut short"):
        import_files(load_spec("criteo"), [f], ImportOptions(raw_dir=Path(settings.raw_dir), day=datetime(2026, 11, 6).date(),
                                                              progress_every_s=60))


def test_stream_after_writes_every_event_to_the_raw_zone(settings: Settings) -> None:
    """The events at or after T go to the stream AND to the raw zone: a run whose T is later
    trains them from the table, one whose T equals it from the stream; none falls between."""
    d = DATA / "synthetic"
    t = datetime(2026, 11, 3, 12, tzinfo=UTC)
    res = import_files(load_spec(), [d / "impressions.jsonl", d / "clicks.jsonl"],
                       ImportOptions(raw_dir=Path(settings.raw_dir), stream_after=t))
    kept = sorted(_raw(settings, "impressions").column("impression_id").to_pylist())
    assert kept == ["imp-1", "imp-2", "imp-3", "imp-5", "imp-6", "imp-7"]  # imp-4 rejected (NaN price)
    assert res.tail is not None and sorted(res.tail.column("sample_id").to_pylist()) == ["imp-6", "imp-7"]
    assert res.sources["impressions"].streamed == 2 and res.sources["impressions"].imported == 6


def _criteo_indicators() -> dict[str, Any]:
    doc = yaml.safe_load((Path(__file__).resolve().parents[2] / "specs" / "criteo.yaml").read_text())
    doc["features"]["i12"]["missing"] = "indicator"
    doc["features"]["c22"]["missing"] = "indicator"
    return doc


def test_a_missing_value_reaches_the_model_as_an_indicator(settings: Settings) -> None:
    spec = spec_from_dict(_criteo_indicators())
    dense = [f.name for f in spec.dense]  # what the trainer reads: each indicator next to its feature
    assert dense[11:14] == ["i12", "i12_missing", "i13"] and dense[-1] == "c22_missing" and len(dense) == 15
    assert spec.feature("i12_missing").indicator_of == "i12"
    opts = ImportOptions(raw_dir=Path(settings.raw_dir), day=datetime(2026, 11, 1).date())
    import_files(spec, [DATA / "criteo" / "day_0.txt"], opts)
    raw = _raw(settings, "displays")
    assert raw.column("I12").to_pylist() == [None, None, 3, None, None]  # blanks stay missing in the raw zone
    samples = Featurizer(spec).samples(raw)
    assert samples.column("i12_missing").to_pylist() == [1.0, 1.0, 0.0, 1.0, 1.0]
    assert samples.column("i12").to_pylist()[0] == 0.0  # the value itself: its default, as before
    assert samples.column("c22_missing").to_pylist() == [1.0, 1.0, 0.0, 1.0, 0.0]


def test_an_indicator_on_a_required_field_is_refused() -> None:
    doc = _criteo_indicators()
    doc["features"]["label_again"] = {"kind": "dense", "field": "label", "missing": "indicator"}
    with pytest.raises(Exception, match="features.label_again.missing: label is a required field, never missing"):
        spec_from_dict(doc)


def test_an_indicator_the_trainer_cannot_default_is_refused() -> None:
    doc = yaml.safe_load((Path(__file__).resolve().parents[2] / "specs" / "ratings.yaml").read_text())
    doc["features"]["gender"]["missing"] = "indicator"  # users.gender defaults to `unknown`
    with pytest.raises(Exception, match=r"features.gender.missing: an indicator on a field whose default is text \('unknown'\)"):
        spec_from_dict(doc)
    doc["features"]["gender"]["missing"] = "default"
    doc["features"]["year"]["missing"] = "indicator"  # a side table's field, numeric default: fine
    spec = spec_from_dict(doc)
    assert [f.name for f in spec.dense] == ["year", "year_missing"]


def test_json_lines_with_a_misnamed_key_and_a_corrupt_gzip_are_refused(settings: Settings, tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """A JSON-lines file is checked on the keys of all its records; a gzip that is no gzip names itself."""
    f = tmp_path / "impressions.jsonl"
    f.write_text((DATA / "synthetic" / "impressions.jsonl").read_text().replace('"user_tenure_days"', '"userTenureDays"'))
    rc, _, err = _run(capsys, str(f))
    assert rc == 2 and "field `user_tenure_days` (did you mean `userTenureDays`?) of source 'impressions' is no column" in err
    bad = tmp_path / "impressions-2.jsonl.gz"
    bad.write_bytes(b"this is plain text, not gzip\n")
    rc, _, err = _run(capsys, str(DATA / "synthetic" / "impressions.jsonl"), str(bad))
    assert rc == 2 and "Traceback" not in err and f"{bad} is not a valid gzip file (Not a gzipped file" in err
    assert not (Path(settings.raw_dir) / "impressions").exists()
