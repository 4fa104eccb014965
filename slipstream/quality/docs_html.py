"""Static HTML of a gate's results (our Data Docs page): one file per checked day/window."""

from __future__ import annotations

import html

from slipstream.quality.gate_result import GateResult

_STYLE = """
body{font-family:system-ui,sans-serif;margin:2em;color:#222}
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:4px 8px;text-align:left}
tr.fail-critical td{background:#fdd}tr.fail-warning td{background:#ffe9b3}
.ok{color:#176317}.bad{color:#a00}
"""


def render_gate_html(result: GateResult) -> str:
    status = "PASSED" if result.passed else "FAILED"
    cls = "ok" if result.passed else "bad"
    rows = []
    for r in result.results:
        row_cls = "" if r.success else f"fail-{r.severity}"
        mark = "✔" if r.success else "✘"
        rows.append(
            f'<tr class="{row_cls}"><td>{mark}</td><td>{html.escape(r.name)}</td><td>{r.severity}</td>'
            f"<td>{html.escape(r.observed)}</td><td>{html.escape(r.expected)}</td>"
            f"<td>{html.escape(r.description)}</td></tr>"
        )
    drift = "".join(
        f"<tr><td>{s.feature}</td><td>{s.method}</td><td>{s.score:.4f}</td><td>{s.threshold:g}</td>"
        f"<td>{s.mean_a:.4g}</td><td>{s.mean_b:.4g}</td></tr>"
        for s in result.drift
    )
    drift_html = (
        "<h2>Drift vs trailing window</h2><table><tr><th>feature</th><th>method</th><th>score</th>"
        f"<th>threshold</th><th>mean (trailing)</th><th>mean (checked)</th></tr>{drift}</table>"
        if result.drift else "<p>No trailing profiles: drift not computed.</p>"
    )
    return f"""<!doctype html><html><head><meta charset="utf-8">
<title>Quality gate {html.escape(result.scope)} — {html.escape(result.run_id)}</title><style>{_STYLE}</style></head>
<body><h1>Quality gate: {html.escape(result.scope)}</h1>
<p class="{cls}"><b>{status}</b> — run {html.escape(result.run_id)}, snapshot {result.snapshot_id},
{result.rows:,} rows, {sum(not r.success for r in result.results)} of {len(result.results)} expectations failed
({len(result.critical_failures)} critical, {len(result.warnings)} warnings), validated in {result.seconds:.2f}s.</p>
<table><tr><th></th><th>expectation</th><th>severity</th><th>observed</th><th>expected</th><th>meaning</th></tr>
{''.join(rows)}</table>{drift_html}
<p>Suite: slipstream.samples (Great Expectations over columnar aggregates). Results are also in the
Iceberg table <code>quality_results</code>.</p></body></html>
"""
