"""glmperf installed from its wheel, as `pip install .` installs it: the shipped presets come with it.

The suite otherwise runs from the checkout, where configs/ sits at the top; a wheel holds only the
packages. scripts/wheel_check.sh (run by .ci/run) goes further: a fresh virtualenv, a real run and
a report.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_wheel_ships_every_preset_and_reads_them(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(tmp_path / "dist")], check=True, capture_output=True)
    wheel = next((tmp_path / "dist").glob("glmperf-*.whl"))
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    shipped = sorted(p.name for p in (ROOT / "configs").glob("*.yaml"))
    assert sorted(p.name for p in (site / "profiler" / "presets").glob("*.yaml")) == shipped

    # the installed code, not the checkout's, resolves --preset tiny to the wheel's tiny.yaml
    probe = ("import json; from profiler.settings import CONFIGS_DIR; from profiler.config import load_config; "
             "c = load_config(preset='tiny', check_here=False); "
             "print(json.dumps([str(CONFIGS_DIR), c.data.seq_len, c.train.batch_size]))")
    out = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, check=True, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(site)}).stdout
    configs_dir, seq_len, batch = json.loads(out)
    assert Path(configs_dir) == site / "profiler" / "presets"
    assert (seq_len, batch) == (64, 8)  # tiny.yaml's, not the model preset's defaults
