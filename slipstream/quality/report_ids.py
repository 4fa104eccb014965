"""The insight report's section on managed embedding tables and the stream's new ids (from
metrics.json's `id_tables`, written by the trainer's finish: trainers.eval.new_ids)."""

from __future__ import annotations

import math
from typing import Any, Protocol


class _Section(Protocol):
    def h2(self, title: str, anchor: str) -> None: ...

    def p(self, text: str, cls: str = "") -> None: ...

    def table(self, rows: list[tuple[Any, ...]], header: tuple[str, ...] | None = None) -> None: ...

    def end(self) -> None: ...


def _num(x: Any, digits: int = 4) -> str:
    return f"{x:.{digits}f}" if isinstance(x, (int, float)) and math.isfinite(x) else "–"


def _ci(x: Any, ci: Any, digits: int = 4) -> str:
    lo, hi = (ci or [None, None])[:2]
    inner = (f" [{lo:.{digits}f}, {hi:.{digits}f}]" if isinstance(lo, (int, float)) and isinstance(hi, (int, float))
             and math.isfinite(lo) and math.isfinite(hi) else "")
    return _num(x, digits) + inner


def _count(x: Any) -> str:
    return f"{x:,}" if isinstance(x, int) else "–"


def id_tables_section(doc: _Section, metrics: dict[str, Any]) -> None:
    """Per managed table: rows, rows in use, ids admitted / evicted / expired (all run, after T);
    the share of held-out stream rows whose id was new at T and the AUC on them and on the others."""
    tables = metrics.get("id_tables") or {}
    if not tables:
        return
    doc.h2("Managed tables and the stream's new ids", "id-tables")
    doc.table([(name, _count(t.get("rows")), _count(t.get("rows_in_use")), _count(t.get("admitted")),
                _count(t.get("admitted_after_t")), _count(t.get("evicted")), _count(t.get("evicted_after_t")),
                _count(t.get("expired")), f"{t.get('eviction')}, admit after {t.get('admit_after')}")
               for name, t in tables.items()],
              ("table", "rows", "in use", "ids admitted", "after T", "evicted", "after T", "expired", "policy"))
    doc.table([(name, f"{_count(t.get('new_at_t_rows'))} of {_count(t.get('eval_rows_after_t'))}",
                _ci(t.get("new_at_t_share"), t.get("new_at_t_share_ci"), 3),
                _ci(t.get("auc_new_ids_after_t"), t.get("auc_new_ids_after_t_ci")),
                _num(t.get("auc_new_ids_after_t_batch_only")),
                _ci(t.get("auc_known_ids_after_t"), t.get("auc_known_ids_after_t_ci")))
               for name, t in tables.items() if "eval_rows_after_t" in t],
              ("feature", "held-out rows after T with an id new at T", "share [95%]", "AUC on them [95%]",
               "batch-only AUC on them", "AUC on the other rows [95%]"))
    doc.p("An id is new at T when no sample of the window before T has it. Every admitted id has a row of its "
          "own (none shared); ids not admitted yet share row 0. Intervals: Wilson for shares, a bootstrap over "
          "users for AUCs. The same AUCs with hashed tables on a long-tailed stream: `slipstream bench embeddings` "
          "(docs/benchmarks.md).")
    doc.end()
