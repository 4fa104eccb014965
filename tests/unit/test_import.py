"""`slipstream import` on small hand-written files of each layout (tests/data/import): rows land
in the folders of their UTC hour, a bad row goes to the rejects file with its reason and line,
a day without records gets no folder, the summary counts are right, and a file whose every row
is bad fails with the reasons, never a traceback."""

from __future__ import annotations

import gzip
import json
import logging
import shutil
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from slipstream.cli import main
from slipstream.errors import RawDataError
from slipstream.lake.importer import ImportOptions, import_files
from slipstream.samples.schema import source_arrow_schema
from slipstream.samples.spec import load_spec
from slipstream.settings import Settings

DATA = Path(__file__).resolve().parents[1] / "data" / "import"
UTC = UTC


def _import(capsys: pytest.CaptureFixture[str], *args: str) -> dict:  # type: ignore[type-arg]
    assert main(["import", "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)


def _days(raw: Path, source: str) -> dict[str, list[str]]:
    """day folder -> its hour folders."""
    return {d.name: sorted(h.name for h in d.iterdir()) for d in sorted((raw / source).iterdir())}


def _rows(raw: Path, source: str, day: str) -> pa.Table:
    files = sorted((raw / source / f"day={day}").rglob("*.parquet"))
    assert all(pq.read_schema(f) == source_arrow_schema(load_spec("ratings" if source == "ratings" else
                                                                   "criteo" if source == "displays" else "synthetic").source(source))
               for f in files)
    return pa.concat_tables([pq.read_table(f) for f in files])


def _rejects(path: str) -> list[dict]:  # type: ignore[type-arg]
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def test_ratings_csv_with_side_tables(settings: Settings, capsys: pytest.CaptureFixture[str]) -> None:
    d = DATA / "ratings"
    out = _import(capsys, "--spec", "ratings", str(d / "ratings.csv"), str(d / "users.csv"), str(d / "items.csv"))
    raw = Path(settings.for_dataset("ratings").raw_dir)  # the data set's own raw zone
    assert _days(raw, "ratings") == {"day=2026-11-01": ["hour=08", "hour=09", "hour=12"],
                                     "day=2026-11-02": ["hour=10", "hour=18"], "day=2026-11-04": ["hour=06", "hour=23"]}
    r = out["sources"]["ratings"]
    assert (r["records"], r["imported"], r["rejected"]) == (8, 7, 1)
    assert r["reasons"] == {"field `rating` not a number": 1}
    assert r["days"] == ["2026-11-01", "2026-11-02", "2026-11-04"] and r["days_without_records"] == ["2026-11-03"]
    [bad] = _rejects(r["rejects_file"])
    assert (bad["line"], bad["raw"]) == (5, "3,12,five,2026-11-01T13:00:00Z") and "`rating`" in bad["reason"] and "'five'" in bad["reason"]
    # epoch seconds, epoch milliseconds, ISO with Z, with a space, with an offset: all the same clock
    ts = [t for day in ("2026-11-01", "2026-11-02", "2026-11-04") for t in _rows(raw, "ratings", day).column("ts").to_pylist()]
    assert [t.isoformat() for t in ts] == [
        "2026-11-01T08:00:00+00:00", "2026-11-01T09:30:00+00:00", "2026-11-01T12:00:00+00:00",
        "2026-11-02T10:00:00+00:00", "2026-11-02T18:30:00+00:00", "2026-11-04T06:15:00+00:00", "2026-11-04T23:59:59+00:00"]
    users = pq.read_table(raw / "users")
    # a missing value stays missing in the raw zone: the featurizer gives it the default
    assert users.to_pylist()[1] == {"user_id": 2, "gender": "M", "age": 41, "occupation": None}
    assert pq.read_table(raw / "items").column("year").to_pylist() == [1979, 2001, None]
    assert (out["sources"]["users"]["imported"], out["sources"]["items"]["imported"]) == (2, 3)
    assert not [p for p in raw.rglob("*") if p.name.startswith("_import") or p.name.startswith("_new")]


def test_criteo_tsv_without_header_spread_over_the_given_day(settings: Settings, capsys: pytest.CaptureFixture[str]) -> None:
    d = DATA / "criteo"
    out = _import(capsys, "--spec", "criteo", "--day", "2026-11-01", str(d / "day_0.txt"))  # the only source
    _import(capsys, "--spec", "criteo", "--source", "displays", "--day", "2026-11-03", str(d / "day_2.txt"))
    raw = Path(settings.for_dataset("criteo").raw_dir)
    # 6 lines spread over the day: (i + 0.5) * 4 h; line 4 (14:00) is the bad one
    assert _days(raw, "displays") == {"day=2026-11-01": ["hour=02", "hour=06", "hour=10", "hour=18", "hour=22"],
                                      "day=2026-11-03": ["hour=04", "hour=12", "hour=20"]}  # 2026-11-02: no folder
    r = out["sources"]["displays"]
    assert (r["records"], r["imported"], r["reasons"]) == (6, 5, {"field `I13` not a number": 1})
    [bad] = _rejects(r["rejects_file"])
    assert bad["line"] == 4 and bad["reason"] == "field `I13`: not a number: 'x7'" and bad["raw"].count("\t") == 39
    day = _rows(raw, "displays", "2026-11-01")
    assert day.column("label").to_pylist() == [0, 1, 0, 0, 1]
    assert day.column("I12").to_pylist()[0] is None and day.column("C22").to_pylist()[0] is None  # empty cells: missing


def test_jsonl_of_the_synthetic_layout_gzipped(settings: Settings, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    gz = tmp_path / "impressions-2026-11.jsonl.gz"
    gz.write_bytes(gzip.compress((DATA / "synthetic" / "impressions.jsonl").read_bytes()))
    out = _import(capsys, str(gz), str(DATA / "synthetic" / "clicks.jsonl"))
    raw = Path(settings.raw_dir)
    assert _days(raw, "impressions") == {"day=2026-11-01": ["hour=08", "hour=19"], "day=2026-11-03": ["hour=09", "hour=12", "hour=13"]}
    assert _days(raw, "clicks") == {"day=2026-11-01": ["hour=08"], "day=2026-11-03": ["hour=09", "hour=12"]}
    imp = out["sources"]["impressions"]
    assert (imp["records"], imp["imported"], imp["reasons"]) == (7, 6, {"field `price` is NaN": 1})
    assert imp["days_without_records"] == ["2026-11-02"]
    [bad] = _rejects(imp["rejects_file"])
    assert bad["line"] == 4 and '"imp-4"' in bad["raw"] and bad["reason"] == "field `price`: is NaN"
    assert _rows(raw, "impressions", "2026-11-01").column("ts").to_pylist()[1] == datetime(2026, 11, 1, 8, 0, 5, 250000, tzinfo=UTC)


def test_a_file_whose_every_row_is_bad_fails_with_the_reasons(settings: Settings, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "ratings.csv"
    f.write_text("user_id,item_id,rating,ts\n1,10,x,1793520000\n2,10,,1793520001\n3,11,4,1793520002,9\n")
    assert main(["import", "--spec", "ratings", str(f)]) == 2
    err = capsys.readouterr().err
    assert f"all 3 rows of {f} rejected: " in err and "field `rating` not a number in 1 record" in err and "Traceback" not in err
    assert "First bad lines: line 2: field `rating`: not a number: 'x'; also lines 3, 4." in err
    raw = Path(settings.for_dataset("ratings").raw_dir)
    assert not (raw / "ratings").exists() and not list(raw.glob("_import*"))
    assert len(_rejects(err.rsplit("Rejected rows: ", 1)[1].split(" Nothing")[0].strip())) == 3

    f.write_text("user_id,item_id,ts\n1,10,1793520000\n")  # a required column missing: refused before reading
    assert main(["import", "--spec", "ratings", str(f)]) == 2
    assert "field `rating` of source 'ratings' is no column of the file" in capsys.readouterr().err

    crit = tmp_path / "day_9.txt"
    crit.write_text("0\t1" + "\t" * 38 + "\n")
    assert main(["import", "--spec", "criteo", "--source", "displays", str(crit)]) == 2
    assert "have no time (`ts` is no column of the file): give --day YYYY-MM-DD" in capsys.readouterr().err


def test_reimport_replaces_the_days_it_covers_and_leaves_the_others(settings: Settings, tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    d = DATA / "ratings"
    _import(capsys, "--spec", "ratings", str(d / "ratings.csv"))
    raw = Path(settings.for_dataset("ratings").raw_dir)
    before = {day: _rows(raw, "ratings", day) for day in ("2026-11-01", "2026-11-02", "2026-11-04")}
    fix = tmp_path / "ratings_fix.csv"
    fix.write_text("user_id,item_id,rating,ts\n9,10,4,2026-11-02T11:00:00Z\n")
    _import(capsys, "--spec", "ratings", str(fix))
    assert _rows(raw, "ratings", "2026-11-02").column("user_id").to_pylist() == [9]
    assert _rows(raw, "ratings", "2026-11-01").equals(before["2026-11-01"])
    _import(capsys, "--spec", "ratings", str(d / "ratings.csv"))  # the same files again: the same days
    assert all(_rows(raw, "ratings", day).equals(t) for day, t in before.items())
    assert _days(raw, "ratings")["day=2026-11-02"] == ["hour=10", "hour=18"]


def test_source_from_the_file_name_else_a_clear_error(settings: Settings, tmp_path: Path) -> None:
    spec = load_spec("ratings")
    odd = tmp_path / "export.csv"
    shutil.copy(DATA / "ratings" / "ratings.csv", odd)
    opts = ImportOptions(raw_dir=Path(settings.raw_dir))
    with pytest.raises(RawDataError, match="cannot tell which source of spec 'ratings' it feeds.*ratings, users, items.*--source"):
        import_files(spec, [odd], opts)
    with pytest.raises(RawDataError, match="--source 'clicks' is not a source of spec 'ratings'"):
        import_files(spec, [odd], ImportOptions(raw_dir=Path(settings.raw_dir), source="clicks"))
    res = import_files(spec, [odd], ImportOptions(raw_dir=Path(settings.raw_dir), source="ratings"))
    assert res.sources["ratings"].imported == 7


def test_malformed_lines_time_range_parquet_input_and_progress(settings: Settings, tmp_path: Path,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    spec = load_spec("ratings")
    f = tmp_path / "ratings.csv"
    f.write_text("user_id,item_id,rating,ts\n1,10,5,1793520000\n1,11,4,1793520001,extra\n\n2,10,3,1793520002\n"
                 "2,11,3,2026-12-24T00:00:00Z\n")
    p = tmp_path / "ratings_more.parquet"
    pq.write_table(pa.table({"user_id": pa.array([5, 6], pa.int32()), "item_id": pa.array([10, 10], pa.int32()),
                             "rating": [4.0, 1.0], "ts": pa.array([datetime(2026, 11, 1, 3, tzinfo=UTC)] * 2)}), p)
    caplog.set_level(logging.INFO, "slipstream.lake")
    opts = ImportOptions(raw_dir=Path(settings.raw_dir), time_from=datetime(2026, 11, 1, tzinfo=UTC),
                         time_to=datetime(2026, 12, 1, tzinfo=UTC), progress_every_s=0)
    res = import_files(spec, [f, p], opts)
    r = res.sources["ratings"]
    assert (r.records, r.imported) == (6, 4)
    assert dict(r.reasons) == {"malformed line": 1, "field `ts` outside [--from, --to)": 1}
    bad = {b["line"]: b for b in _rejects(str(r.rejects_file))}
    assert set(bad) == {3, 6} and bad[3]["raw"] == "1,11,4,1793520001,extra" and "5 columns, expected 4" in bad[3]["reason"]
    assert "2026-12-24" in bad[6]["reason"]
    assert any("rows/s" in m and "ETA" in m for m in caplog.messages)
    assert "no records" not in res.render() and "ratings: 2 files, 6 records: 4 imported into 1 day folder" in res.render()
