"""The self-contained HTML file: jinja2 templates (reports/templates/) with autoescape, plotly's
JavaScript inlined once, and each figure as JSON in an inert `<script type="application/json">`
that one small loader hands to `Plotly.newPlot`.

Everything a user typed (run names, config values, paths, error messages) reaches the page through
the templates' autoescape, and reaches the figures' JSON escaped for a script element (`<`, `>` and
`&` as \\u escapes), so no text from a run can end a script or start one.
"""

from __future__ import annotations

import os
import stat
import tempfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import jinja2
import plotly.graph_objects as go
import plotly.offline
from markupsafe import Markup

from reports import paths
from reports.plotting import caption, title

TEMPLATES = Path(__file__).resolve().parent / "templates"


@dataclass(frozen=True)
class Section:
    """One figure of a report: its anchor, heading, caption and the figure as JSON for the page."""

    id: str
    title: str
    caption: str
    spec: Markup


@dataclass(frozen=True)
class Missing:
    """A figure a report leaves out, and why (the run measured nothing of the kind)."""

    title: str
    why: str


def script_json(text: str) -> Markup:
    """JSON text made safe inside a <script> element: the same JSON, with no `<`, `>` or `&` left."""
    return Markup(text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e"))


def section(anchor: str, fig: go.Figure) -> Section:
    """A figure as a report section (title and caption from the figure itself)."""
    drawn = go.Figure(fig).update_layout(title_text="")  # the page's heading is the title
    return Section(anchor, title(fig), caption(fig), script_json(drawn.to_json()))


def sections(figures: list[tuple[str, go.Figure | None, str]]) -> tuple[list[Section], list[Missing]]:
    """(name, figure or None, why it would be missing) -> the sections shown and the figures left out."""
    shown = [section(name.lower().replace(" ", "-"), fig) for name, fig, _ in figures if fig is not None]
    return shown, [Missing(name, why) for name, fig, why in figures if fig is None]


@cache
def _environment() -> jinja2.Environment:
    return jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True,
                              undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)


@cache
def plotly_js() -> Markup:
    """plotly.js, as plotly's own offline HTML inlines it (once per report)."""
    return Markup(plotly.offline.get_plotlyjs())


def render(template: str, **context: Any) -> str:
    """A report page from its template and context; the page template extends base.html."""
    return _environment().get_template(template).render(plotly_js=plotly_js(), **context)


def write(path: Path, text: str) -> Path:
    """Write the page and return its path: over a regular file (keeping its mode) or at a new path, never
    through a link or over a device (paths.check_output). Atomic: the page goes to a temp file beside
    `path`, synced, then renamed over it, so a reader, a full disk or a Ctrl-C never leaves half a
    report, and the temp file is removed on any failure."""
    paths.check_output(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask  # as any file the user writes (mkstemp makes it private)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(text.encode("utf-8"))
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
