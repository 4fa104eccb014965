"""The insight report's page: sections of paragraphs, tables and plots, and its findings.

A `Finding` is one fact a person acts on (the model's verdict, the gate, exactly once, drift,
skew...): its sentence, whether it is good, and for a bad one a line on what to do. The summary
lists every finding and the section it comes from repeats the same sentence, so the summary, the
sections and the promotion line never say the same thing in different words.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

from slipstream.templating import render


@dataclass(frozen=True)
class Finding:
    topic: str
    text: str
    ok: bool | None
    """True: good news; False: red, something to act on; None: neither (unknown, not applicable)."""
    action: str = ""
    """For a red finding: one line on what to do."""
    anchor: str = ""
    """The section it comes from."""

    @property
    def cls(self) -> str:
        return {True: "ok", False: "bad", None: "muted"}[self.ok]


class ReportDoc:
    """The report's content in page order: sections (`h2` ... `end`) of paragraphs, tables and
    plots, rendered at the end by `templates/report.html.j2` (Jinja2, autoescaped)."""

    def __init__(self) -> None:
        self.blocks: list[dict[str, Any]] = []
        self._section: dict[str, Any] | None = None

    def _add(self, block: dict[str, Any]) -> None:
        (self._section["blocks"] if self._section is not None else self.blocks).append(block)

    def h2(self, title: str, anchor: str) -> None:
        self._section = {"kind": "section", "title": title, "anchor": anchor, "blocks": []}
        self.blocks.append(self._section)

    def end(self) -> None:
        self._section = None

    def p(self, text: str, cls: str = "") -> None:
        self._add({"kind": "p", "text": text, "cls": cls})

    def finding(self, f: Finding) -> None:
        """The finding's sentence, and for a red one what to do."""
        self.p(f.text, f.cls)
        if f.ok is False and f.action:
            self.p(f"What to do: {f.action}", "todo")

    def table(self, rows: list[tuple[Any, ...]], header: tuple[str, ...] | None = None,
              classes: list[str] | None = None) -> None:
        """Rows of cells; `classes` gives each row a CSS class (`bad` for a red row)."""
        self._add({"kind": "table", "header": header or (), "rows": [[str(c) for c in r] for r in rows],
                   "classes": classes or [""] * len(rows)})

    def img(self, png: bytes | None, alt: str) -> None:
        if png:
            self._add({"kind": "img", "alt": alt, "png_base64": base64.b64encode(png).decode("ascii")})

    def render(self, run_id: str, footer: str) -> str:
        return render("slipstream.quality", "report.html.j2", run_id=run_id, blocks=self.blocks, footer=footer)


def findings_table(doc: ReportDoc, findings: list[Finding]) -> None:
    """The summary: every finding, red ones with what to do, each linking to its section."""
    doc.table([(f.topic, f.text, f.action if f.ok is False else "") for f in findings],
              ("", "finding", "what to do"), [{"ok": "", "bad": "bad", "muted": "muted"}[f.cls] for f in findings])
