"""The report's training curve shows a short run's few metrics lines (issue 23, item 9)."""

from __future__ import annotations

import io

import numpy as np

from slipstream.quality.plots import training_curve

LOSS_BLUE = np.array([0x1F, 0x77, 0xB4]) / 255  # matplotlib's first colour, the loss curve's


def _blue_pixels(png: bytes) -> int:
    import matplotlib.image as mpimg

    rgb = mpimg.imread(io.BytesIO(png), format="png")[..., :3]
    return int((np.abs(rgb - LOSS_BLUE).max(axis=-1) < 0.08).sum())


def test_a_single_metrics_line_is_drawn() -> None:
    png = training_curve([{"step": 5, "loss": 0.61}])
    assert png is not None and _blue_pixels(png) > 20  # a visible point, not an empty axis


def test_a_longer_run_draws_its_curve() -> None:
    png = training_curve([{"step": s, "loss": 0.7 - s / 1000} for s in range(0, 500, 5)])
    assert png is not None and _blue_pixels(png) > 200
