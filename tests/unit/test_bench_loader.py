"""`slipstream bench loader` at toy sizes: the loader and raw read the same rows, the loader
delivers the training rows (not the held-out ones) with both list gathers, the shuffle floor reads
them too, and the result carries its ratio fields (no timing goals)."""

from __future__ import annotations

from slipstream.samples import native


def test_bench_loader_reads_the_window_and_reports_ratios() -> None:
    from bench.loader import main

    out = main(["--json", "--days", "2", "--per-day", "4000", "--row-group-rows", "1000", "--repeat", "2", "--naive-rows", "500"])
    assert out["benchmark"] == "loader"
    assert out["rows_window"] == 8000  # both days, every row (the bench checks the loader read as many)
    assert 0.8 * 8000 < out["rows_loader"] < 8000  # about a tenth is held out
    for key in ("vs_raw", "vs_raw_median", "vs_raw_cpu", "vs_raw_epoch2", "vs_naive", "vs_raw_arrow", "native_speedup",
                "floor_vs_raw", "floor_vs_raw_median", "vs_floor", "vs_floor_median"):
        assert out[key] > 0, key
    # the first batch comes before its epoch ends
    assert 0 < out["first_batch_s"] <= max(out["loader_runs_s"]) and 0 < out["first_batch_share"] <= 1
    assert len(out["loader_runs_s"]) == len(out["raw_runs_s"]) == len(out["floor_runs_s"]) == 2
    assert (out["native_kernel"] is not None) == (native.kernels() is not None)
