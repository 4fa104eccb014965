"""The HTML pages Slipstream writes come from Jinja2 templates with autoescape: what a page shows
from data (ids, observed values, run ids) is shown as text, never run as markup."""

from __future__ import annotations

from datetime import UTC, datetime

from slipstream.quality.docs_html import render_gate_html
from slipstream.quality.drift import FeatureShift
from slipstream.quality.gate_result import GateResult
from slipstream.quality.report_doc import ReportDoc
from slipstream.quality.suites import CheckResult

EVIL = "<script>alert(1)</script>"


def test_gate_page_shows_every_check_and_escapes_observed_values() -> None:
    now = datetime(2026, 11, 3, tzinfo=UTC)
    results = [CheckResult("unique.sample_id", "critical", False, f"2 (e.g. {EVIL})", "== 0", "no duplicate ids"),
               CheckResult("ctr", "warning", False, "0.9", "[0.005, 0.6]", "click-through rate"),
               CheckResult("schema", "critical", True, "ok", "ok", "columns and types")]
    drift = [FeatureShift("price_log", "psi", 0.23456, 0.2, 0.5, 0.6, 0.0, 0.0, rows_a=28_000, rows_b=4_000, baseline_days=21)]
    page = render_gate_html(GateResult(run_id="run-1", scope="day:2026-11-03", snapshot_id=42, start=now, end=now,
                                       rows=1_234_567, results=results, drift=drift, seconds=1.5))
    assert EVIL not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<b>FAILED</b>" in page
    assert "1,234,567 rows, 2 of 3 expectations failed (1 critical, 1 warnings)" in " ".join(page.split())
    assert '<tr class="fail-critical"><td>✘</td><td>unique.sample_id</td><td>critical</td>' in page
    assert '<tr class="fail-warning"><td>✘</td><td>ctr</td>' in page
    assert ('<tr class="fail-warning"><td>price_log</td><td>psi</td><td>0.2346</td><td>0.2000</td><td>28,000 / 4,000</td>'
            "<td>21</td><td>0.5</td><td>0.6</td><td>moved more than usual</td></tr>") in page


def test_report_blocks_render_in_their_sections_escaped() -> None:
    doc = ReportDoc()
    doc.p("before any section", "bad")
    doc.h2("Exactly-once audit", "audit")
    doc.p(EVIL, "muted")
    doc.table([("iceberg", 0, "1,000")], ("source", "epoch", "expected"))
    doc.img(b"\x89PNG", "a plot")
    doc.img(None, "no plot")
    doc.end()
    page = doc.render(f"run-{EVIL}", "footer")
    assert EVIL not in page and page.count("&lt;script&gt;") == 3  # title, heading, paragraph
    section = page.split('<section id="audit"><h2>Exactly-once audit</h2>')[1].split("</section>")[0]
    assert "<tr><th>source</th><th>epoch</th><th>expected</th></tr>" in section
    assert "<tr><td>iceberg</td><td>0</td><td>1,000</td></tr>" in section
    assert section.count("<img") == 1 and 'src="data:image/png;base64,iVBORw=="' in section
    assert page.index('<p class="bad">before any section</p>') < page.index('<section id="audit">')
