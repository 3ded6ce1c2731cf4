"""Each kind of report opened in a real headless Chromium (Debian's package, /usr/bin/chromium, which
.ci/run installs): the rendered DOM holds every figure's SVG and no script error, and a screenshot
of the comparison is saved under the test's temp dir."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from profiler.cli import main
from tests.test_report_pages import XSS, Page, write_sweep

CHROMIUM = Path("/usr/bin/chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--virtual-time-budget=15000", "--window-size=1200,4000"]

ERRORS = re.compile(r'<html[^>]*data-script-errors="([^"]*)"')
"""What the page's error hook writes on the root element."""

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not CHROMIUM.exists(), reason=f"no Chromium at {CHROMIUM} (apt-get install chromium)")]


def chromium(page: Path, *args: str) -> str:
    done = subprocess.run([str(CHROMIUM), *FLAGS, *args, page.as_uri()], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_every_report_renders_in_chromium(completed_run: Path, failed_run: Path, two_rank_run: Path,
                                          tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sweep = write_sweep(tmp_path, [completed_run, two_rank_run])
    reports = {"completed": [str(completed_run)], "failed": [str(failed_run)], "two-ranks": [str(two_rank_run)],
               "compare": ["--compare", str(completed_run), str(two_rank_run)], "sweep": ["--sweep", str(sweep)]}
    for name, args in reports.items():
        out = tmp_path / f"{name}.html"
        assert main(["report", *args, "-o", str(out)]) == 0
        capsys.readouterr()
        figures = len(Page(out.read_text(encoding="utf-8")).sections)
        dom = chromium(out, "--dump-dom")
        assert not ERRORS.search(dom), (name, ERRORS.search(dom))
        assert '<div id="script-errors" hidden="">' in dom, name
        assert dom.count('class="main-svg"') >= figures > 0, name  # plotly draws one or more SVGs a figure
        assert XSS not in dom
        if name == "compare":  # one screenshot to look at: each Chromium start costs seconds
            chromium(out, f"--screenshot={tmp_path / f'{name}.png'}")
            assert (tmp_path / f"{name}.png").stat().st_size > 10_000, name


def test_a_script_error_would_show(completed_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The check above is not vacuous: an error in the page lands in the DOM that Chromium dumps."""
    out = tmp_path / "broken.html"
    assert main(["report", str(completed_run), "-o", str(out)]) == 0
    capsys.readouterr()
    out.write_text(out.read_text(encoding="utf-8").replace("</body>", "<script>notDefined();</script></body>"))
    dom = chromium(out, "--dump-dom")
    assert "notDefined" in ERRORS.search(dom).group(1)
