"""The insight report's managed-table section: what metrics.json's id_tables says, with counts and
intervals, and nothing when the run has no managed table."""

from __future__ import annotations

from typing import Any

from slipstream.quality.report_ids import id_tables_section


class _Doc:
    def __init__(self) -> None:
        self.blocks: list[tuple[str, Any]] = []

    def h2(self, title: str, anchor: str) -> None:
        self.blocks.append(("h2", title))

    def p(self, text: str, cls: str = "") -> None:
        self.blocks.append(("p", text))

    def table(self, rows: list[tuple[Any, ...]], header: tuple[str, ...] | None = None) -> None:
        self.blocks.append(("table", [header, *rows]))

    def end(self) -> None:
        self.blocks.append(("end", None))


def test_the_section_shows_the_tables_and_the_new_id_rows() -> None:
    doc = _Doc()
    id_tables_section(doc, {"id_tables": {"user_id": {
        "table": "managed", "rows": 100000, "rows_in_use": 982, "admitted": 1100, "admitted_after_t": 128, "evicted": 118,
        "evicted_after_t": 4, "expired": 0, "admit_after": 3, "eviction": "lru", "eval_rows_after_t": 83, "new_at_t_rows": 4,
        "new_at_t_share": 4 / 83, "new_at_t_share_ci": [0.0189, 0.1175], "auc_new_ids_after_t": None,
        "auc_new_ids_after_t_ci": [None, None], "auc_known_ids_after_t": 0.7175, "auc_known_ids_after_t_ci": [0.6134, 0.8094]}}})
    assert doc.blocks[0] == ("h2", "Managed tables and the stream's new ids")
    counts = doc.blocks[1][1]
    assert counts[1] == ("user_id", "100,000", "982", "1,100", "128", "118", "4", "0", "lru, admit after 3")
    rows = doc.blocks[2][1]
    assert rows[1] == ("user_id", "4 of 83", "0.048 [0.019, 0.117]", "–", "–", "0.7175 [0.6134, 0.8094]")


def test_no_managed_table_no_section() -> None:
    doc = _Doc()
    id_tables_section(doc, {"auc": 0.7})
    assert doc.blocks == []
