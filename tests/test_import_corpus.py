"""Every public trace the tests hold, and the shared real ones: `glmperf import`, `show`, `diagnose`,
`report` and `--json` end with an exit code and, at most, one error line (never a traceback), and
every JSON they print or store parses under strict RFC 8259 (no bare NaN)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from profiler.cli import main
from tests.test_import_errors import GOOD

ROOT = Path(__file__).resolve().parent
PUBLIC = ROOT / "data" / "traces_public"
SHARED = GOOD.parent.parent
TRACE = ("*.json", "*.json.gz")


def corpus() -> list[Path]:
    """The directories that hold traces (or hold one trace file), public first, then the shared ones."""
    found = {f.parent for root in (PUBLIC, SHARED) if root.exists() for p in TRACE for f in root.rglob(p)}
    return sorted(found - {SHARED})


def strict(text: str) -> object:
    """`text` parsed as strict JSON: NaN and infinities are refused, as other tools' parsers do."""
    def refuse(constant: str) -> None:
        raise AssertionError(f"bare {constant} in JSON")
    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize("trace_dir", corpus(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_command_on_every_trace_ends_cleanly(trace_dir: Path, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    runs = str(tmp_path / "runs")
    assert main(["import", str(trace_dir), "--runs-dir", runs, "--name", "corpus", "--json"]) == 0
    imported = strict(capsys.readouterr().out)
    assert isinstance(imported, dict)
    run = imported["id"]
    for command in (["show"], ["diagnose"], ["show", "--json"], ["diagnose", "--json"]):
        code = main([*command, run, "--runs-dir", runs])
        out, err = capsys.readouterr()
        assert code in (0, 1, 2), (command, code)
        assert "Traceback" not in err and err.count("\n") <= 1, (command, err)
        if "--json" in command and code != 2:
            strict(out)
    assert main(["report", run, "--runs-dir", runs]) == 0
    assert "Traceback" not in capsys.readouterr().err
    for written in (tmp_path / "runs").rglob("*.json*"):  # what it stored too: run.json, events.jsonl
        for line in written.read_text().splitlines() if written.suffix == ".jsonl" else [written.read_text()]:
            strict(line)
