"""`glmperf dashboard` served for real and loaded in a headless Chromium (Debian's package, which .ci/run
installs): each page's rendered DOM holds its heading, the runs and a drawn plotly figure; a
screenshot of the compare page is saved under the test's temp dir."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.conftest import copy_run
from tests.dashboard_server import serving

CHROMIUM = Path("/usr/bin/chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--virtual-time-budget=15000", "--window-size=1400,3000"]
RUNNING = 'aria-label="Running..."'
"""The status widget while the page's script still runs."""

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not CHROMIUM.exists(), reason=f"no Chromium at {CHROMIUM} (apt-get install chromium)")]


def chromium(url: str, *args: str) -> str:
    done = subprocess.run([str(CHROMIUM), *FLAGS, *args, url], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def rendered(url: str, expected: list[str], tries: int = 10) -> str:
    """The page's DOM once its script run finished and it shows the `expected` texts. Chromium's
    virtual time gives a page little real time, and a page whose data is not cached yet takes longer
    than that to compute: the first load of each page computes it, a later one renders it from the
    cache. A server still importing (a fresh checkout compiles every module first) answers with only
    placeholders: no heading yet; a busy machine can leave the runs table's cells unfilled."""
    for _ in range(tries):
        dom = chromium(url, "--dump-dom")
        if RUNNING not in dom and "<h1" in dom and all(text in dom for text in expected):
            return dom
    return dom


@pytest.fixture
def dashboard(tmp_path: Path, completed_run: Path, failed_run: Path, two_rank_run: Path):
    """A running `glmperf dashboard` over a copy of three runs; yields its URL and the runs' ids."""
    runs = tmp_path / "runs"
    runs.mkdir()
    ids = [copy_run(r, runs).name for r in (completed_run, failed_run, two_rank_run)]
    with serving(runs, tmp_path / "dashboard.log") as (_, port):
        url = f"http://127.0.0.1:{port}"  # where the dashboard serves by default
        chromium(url, "--dump-dom")  # a fresh server's first page shows only placeholders
        yield url, ids


def test_every_page_renders_in_chromium(dashboard: tuple[str, list[str]], tmp_path: Path) -> None:
    url, (done, failed, two) = dashboard
    pages = {"runs": (url, "Runs", [done, failed, two]),
             "run": (f"{url}/run?run={done}", "Run", [done]),
             "failed": (f"{url}/run?run={failed}", "Run", [failed, "failed after"]),
             "compare": (f"{url}/compare?base={done}&cand={two}", "Compare", [done, two, "Verdict:"]),
             "recommend": (f"{url}/recommend?run={done}", "Recommend", [done, "Verify by rerunning"])}
    for name, (address, heading, expected) in pages.items():
        dom = rendered(address, expected)
        assert RUNNING not in dom, name
        assert f'<h1 id="{heading.lower()}"' in dom, name
        for text in expected:
            assert text in dom, (name, text)
        if name != "runs":
            assert 'class="main-svg"' in dom, name  # plotly drew a figure
        else:
            assert 'data-testid="stDataFrame"' in dom and 'role="gridcell"' in dom, name  # the runs table
        assert "Traceback" not in dom and 'data-testid="stException"' not in dom, name
        if name == "compare":  # one screenshot to look at: each Chromium start costs seconds
            chromium(address, f"--screenshot={tmp_path / f'{name}.png'}")
            assert (tmp_path / f"{name}.png").stat().st_size > 10_000, name
