"""The native kernels (slipstream/samples/native/ragged.c): the list gather gives exactly the arrays of the
Arrow path, and the id hash follows the schema's rule."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from slipstream.samples import native
from slipstream.samples.ragged import flat_list, take_list_column, take_lists
from slipstream.samples.schema import HOLDOUT_MODULO, id_hash
from trainers.data.rows import SOURCE_ICEBERG, Rows


@pytest.fixture(scope="module", autouse=True)
def built() -> native.Kernels:
    if native.compiler() is None:
        pytest.skip("no C compiler on this machine: only the Arrow path runs")
    kern = native.kernels()
    assert kern is not None, "a C compiler is present but the native kernel did not build (see the log)"
    return kern


def _lists(rng: np.random.Generator, n: int, max_len: int = 40) -> list[list[int]]:
    return [rng.integers(-2**62, 2**62, size=int(rng.integers(0, max_len))).tolist() for _ in range(n)]


def _both(column: pa.ChunkedArray | pa.Array, idx: np.ndarray) -> None:
    with native.enabled(False):
        want_v, want_o = take_list_column(column, idx)
    with native.enabled(True):
        got_v, got_o = take_list_column(column, idx)
    np.testing.assert_array_equal(got_o, want_o)
    np.testing.assert_array_equal(got_v, want_v)
    assert got_v.dtype == np.int64 and got_o.dtype == np.int64
    # and both are the lists at idx, as Python sees them
    full = column.to_pylist()
    assert [got_v[a:b].tolist() for a, b in zip(got_o[:-1], got_o[1:])] == [full[i] or [] for i in idx]


def test_chunked_sliced_and_repeated_rows_match_the_arrow_path() -> None:
    rng = np.random.default_rng(7)
    chunks = [pa.array(_lists(rng, n), pa.list_(pa.int64())) for n in (500, 1, 0, 1300)]
    chunks[3] = chunks[3].slice(17, 1200)  # a slice: offsets not from zero, child not sliced
    col = pa.chunked_array(chunks, pa.list_(pa.int64()))
    n = len(col)
    _both(col, rng.permutation(n))  # a shuffle (what the loader does)
    _both(col, rng.permutation(n)[: n // 3])
    _both(col, rng.integers(0, n, size=3 * n))  # rows taken more than once: more values than the column has
    _both(col, np.zeros(0, dtype=np.int64))
    _both(col.chunk(0), np.arange(10)[::-1].copy())


def test_many_chunks_with_empty_ones_anywhere() -> None:
    # each row is found in its chunk however many chunks there are (empty ones first, between, last)
    rng = np.random.default_rng(9)
    for sizes in ((0, 3, 0, 0, 5, 1, 0, 7, 2, 0), (0, 0, 40), (40, 0, 0), tuple(range(1, 18))):
        col = pa.chunked_array([pa.array(_lists(rng, n, 6), pa.list_(pa.int64())) for n in sizes], pa.list_(pa.int64()))
        _both(col, rng.permutation(len(col)))
        _both(col, rng.integers(0, len(col), size=50))


def test_empty_lists_nulls_and_large_lists() -> None:
    rng = np.random.default_rng(8)
    _both(pa.array([[], [], []], pa.list_(pa.int64())), np.array([2, 0, 1, 1]))
    _both(pa.array([[1, 2], None, [], [3]], pa.list_(pa.int64())), np.array([1, 3, 0, 2]))  # nulls: Arrow path
    _both(pa.array(_lists(rng, 300), pa.large_list(pa.int64())), rng.permutation(300))


def test_numpy_lists_match_and_bad_rows_are_refused() -> None:
    rng = np.random.default_rng(9)
    values, offsets = flat_list(pa.array(_lists(rng, 400), pa.list_(pa.int64())))
    values, offsets = np.concatenate([np.full(5, -7, np.int64), values]), offsets + 5  # offsets not from zero
    idx = rng.integers(0, len(offsets) - 1, size=1000)
    with native.enabled(False):
        want = take_lists(values, offsets, idx)
    got = take_lists(values, offsets, idx)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])
    with pytest.raises(IndexError, match=r"row index out of range \[0, 400\)"):
        take_lists(values, offsets, np.array([0, 400]))
    with pytest.raises(IndexError, match="out of range"):
        take_list_column(pa.array([[1], [2]], pa.list_(pa.int64())), np.array([-1]))
    with pytest.raises(ValueError, match="must ascend within the 6 values"):
        take_lists(np.arange(6, dtype=np.int64), np.array([0, 4, 9]), np.array([1]))  # past the end
    with pytest.raises(ValueError, match="the lists are corrupt"):
        take_lists(np.arange(6, dtype=np.int64), np.array([0, 4, 2, 6]), np.array([0]))


def test_rows_from_arrow_same_with_and_without_native() -> None:
    rng = np.random.default_rng(10)
    from slipstream.samples.schema import ARROW_SCHEMA

    n = 2000
    data = {}
    for field in ARROW_SCHEMA:
        if field.name == "hist_items":
            data[field.name] = pa.array(_lists(rng, n, 25), field.type)
        elif field.name == "sample_id":
            data[field.name] = pa.array([f"imp-{i}" for i in range(n)], field.type)
        elif pa.types.is_timestamp(field.type):
            data[field.name] = pa.array(rng.integers(0, 2**50, n), pa.int64()).cast(field.type)
        elif pa.types.is_floating(field.type):
            data[field.name] = pa.array(rng.random(n), field.type)
        else:
            data[field.name] = pa.array(rng.integers(0, 100, n), field.type)
    table = pa.table(data, schema=ARROW_SCHEMA)
    table = pa.concat_tables([table.slice(0, 700), table.slice(700)])  # two chunks per column
    take = rng.permutation(n)[:1500]
    with native.enabled(False):
        want = Rows.from_arrow(table, source=SOURCE_ICEBERG, epoch=1, take=take)
    got = Rows.from_arrow(table, source=SOURCE_ICEBERG, epoch=1, take=take)
    for name in ("sparse", "dense", "label"):
        np.testing.assert_array_equal(getattr(got, name), getattr(want, name))
    for a, b in zip(got.list_values + got.list_offsets, want.list_values + want.list_offsets):
        np.testing.assert_array_equal(a, b)
    assert got.sample_id.equals(want.sample_id)


def test_id_hash_kernel_is_the_schema_rule_for_any_modulo(built: native.Kernels) -> None:
    # ids of every length 0..30 (some with NUL bytes, which the hash skips), a count that is not
    # a multiple of the kernel's four lanes, and moduli odd, even, powers of two and the extremes
    rng = np.random.default_rng(3)
    alphabet = np.array(list("imp-0123456789\x00"))
    ids = ["".join(rng.choice(alphabet, size=int(rng.integers(0, 31)))) for _ in range(1003)]
    arr = pa.array(ids, pa.string())
    bufs = arr.buffers()
    hashes = id_hash(ids)
    for modulo in (1, 2, 3, 10, 16, 97, 2**63, 2**64 - 1, HOLDOUT_MODULO):
        out = np.empty(len(ids), dtype=np.uint8)
        built.fnv1a_divisible(len(ids), bufs[1].address, bufs[2].address, modulo, out.ctypes.data)
        np.testing.assert_array_equal(out.view(np.bool_), hashes % np.uint64(modulo) == 0, err_msg=f"modulo {modulo}")
    assert 0 < np.count_nonzero(hashes % np.uint64(HOLDOUT_MODULO) == 0) < len(ids)


def test_no_compiler_falls_back_with_one_warning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setenv(native.DIR_ENV, str(tmp_path / "cache"))
    with pytest.raises(native.NativeBuildError, match="no-such-cc"):
        native.build()
    assert not list((tmp_path / "cache").iterdir())  # the failed build left nothing behind
    monkeypatch.setattr(native, "_loaded", [])
    with caplog.at_level(logging.WARNING, logger="slipstream.samples.native"):
        assert native.kernels() is None
        assert native.kernels() is None
    assert [r.getMessage() for r in caplog.records].count(caplog.records[0].getMessage()) == 1
    assert "using Arrow's take" in caplog.records[0].getMessage()
    values, offsets = take_lists(np.arange(6, dtype=np.int64), np.array([0, 2, 6]), np.array([1, 0]))
    assert values.tolist() == [2, 3, 4, 5, 0, 1] and offsets.tolist() == [0, 4, 6]


def test_built_once_and_found_without_a_compiler(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(native.DIR_ENV, str(tmp_path))
    first = native.build()
    stamp = first.stat().st_mtime_ns
    assert native.build() == first and first.stat().st_mtime_ns == stamp
    assert [p.name for p in tmp_path.iterdir()] == [first.name]  # no temporary files left behind
    # a library built ahead (an image's build stage) is used where no compiler is installed
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setattr(native, "_loaded", [])
    kern = native.kernels()
    assert kern is not None and kern.path == first


def test_env_switch_disables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(native.DISABLE_ENV, "0")
    assert native.kernels() is None
    monkeypatch.setenv(native.DISABLE_ENV, "1")
    assert native.kernels() is not None
