"""Static HTML of a gate's results (our Data Docs page): one file per checked day/window,
rendered from `templates/gate.html.j2`."""

from __future__ import annotations

from slipstream.quality.gate_result import GateResult
from slipstream.templating import render


def render_gate_html(result: GateResult) -> str:
    failed = sum(not r.success for r in result.results)
    return render("slipstream.quality", "gate.html.j2", result=result, failed=failed)
