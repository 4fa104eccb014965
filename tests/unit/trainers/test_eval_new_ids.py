"""The report of managed tables: the share of stream rows whose id was new at T with its Wilson
interval, the AUC on them and on the others, counts and nothing invented where there are no rows."""

from __future__ import annotations

import json
import math

import numpy as np

from slipstream.samples.spec import load_spec
from trainers.eval.new_ids import id_tables_report, wilson


def test_wilson_intervals_hold_the_share_and_end_at_0_and_1() -> None:
    lo, hi = wilson(30, 100)
    assert lo < 0.3 < hi and math.isclose(lo, 0.2189, abs_tol=1e-3) and math.isclose(hi, 0.3958, abs_tol=1e-3)
    assert wilson(0, 50)[0] == 0.0 and wilson(50, 50)[1] == 1.0
    assert all(math.isnan(x) for x in wilson(0, 0))


def test_the_report_splits_the_rows_by_new_at_t_and_writes_no_nan() -> None:
    spec = load_spec("ratings")
    rng = np.random.default_rng(0)
    n = 400
    labels = (rng.random(n) < 0.4).astype(np.float32)
    new = np.arange(n) < 100  # the first 100 rows' users were new at T
    probs = np.where(new, 0.5, labels * 0.6 + 0.2).astype(np.float32)  # perfect on known, chance on new
    stats = {"user_id": {"rows": 50, "rows_in_use": 49, "admitted": 70, "evicted": 21, "expired": 0},
             "item_id": {"rows": 30, "rows_in_use": 29, "admitted": 29, "evicted": 0, "expired": 0}}
    at_t = {"user_id": {"rows": 50, "rows_in_use": 40, "admitted": 40, "evicted": 0, "expired": 0},
            "item_id": {"rows": 30, "rows_in_use": 29, "admitted": 29, "evicted": 0, "expired": 0}}
    ids = {"user_id": np.arange(n) % 37, "item_id": np.arange(n) % 11}
    out = id_tables_report(spec, stats, at_t, ids, {"user_id": new, "item_id": np.zeros(n, dtype=bool)}, labels, probs,
                           None, groups=np.arange(n))
    u = out["user_id"]
    assert u["new_at_t_rows"] == 100 and u["eval_rows_after_t"] == 400 and u["new_at_t_share"] == 0.25
    assert u["new_at_t_share_ci"][0] < 0.25 < u["new_at_t_share_ci"][1]
    assert u["auc_new_ids_after_t"] == 0.5 and u["auc_known_ids_after_t"] == 1.0
    assert u["admitted_after_t"] == 30 and u["evicted_after_t"] == 21 and u["rows_in_use_at_t"] == 40
    i = out["item_id"]
    assert i["new_at_t_rows"] == 0 and i["auc_new_ids_after_t"] is None and i["auc_new_ids_after_t_ci"] == [None, None]
    json.dumps(out, allow_nan=False)  # strict JSON: no NaN anywhere
