"""HTML pages from Jinja2 templates that ship as package data (`<package>/templates/*.html.j2`).

One environment per package, built on first use and kept for the process: templates compile
once, autoescape is on (every value is escaped unless a template says otherwise), and an
undefined name is an error rather than an empty string. Jinja2 is imported on first use, so
importing a module that renders a page costs nothing until it does.
"""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import jinja2


@cache
def environment(package: str) -> jinja2.Environment:
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.PackageLoader(package, "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["thousands"] = lambda n: f"{n:,}"
    return env


def render(package: str, template: str, **context: Any) -> str:
    """`<package>/templates/<template>` rendered with `context`."""
    return environment(package).get_template(template).render(**context)
