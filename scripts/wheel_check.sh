#!/usr/bin/env bash
# glmperf as users install it: build the wheel, install it into a fresh virtualenv, and from a
# directory with no checkout in sight run `profile-run --preset tiny` and `glmperf report` on it.
# The run must have trained with configs/tiny.yaml's settings (shipped inside the package), not
# the model preset alone. Usage: scripts/wheel_check.sh (after `make test`: it uses .venv to build).
set -euo pipefail
cd "$(dirname "$0")/.."
TORCH_SPEC=${TORCH_SPEC-torch==2.13.0}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

.venv/bin/python -m pip wheel . --no-deps --no-build-isolation -q -w "$work/dist" 2>/dev/null
python3 -m venv "$work/venv"
pip() { "$work/venv/bin/python" -m pip install -q "$@" 2> >(grep -v "is ignored: it is neither" >&2); }
pip --upgrade pip
if [ -n "$TORCH_SPEC" ]; then pip "$TORCH_SPEC"; fi
pip "$work"/dist/glmperf-*.whl

mkdir "$work/user" && cd "$work/user"
"$work/venv/bin/profile-run" --preset tiny --steps 6 --no-trace --no-progress --runs-dir runs --json > run.json
"$work/venv/bin/python" - <<'PY'
import json
from pathlib import Path
run = json.load(open("run.json"))
cfg = json.loads((Path(run["path"]) / "run.json").read_text())["config"]
# tiny.yaml's own settings, which the model preset alone does not give
assert cfg["data"]["seq_len"] == 64 and cfg["train"]["batch_size"] == 8, cfg
print(f"wheel: profile-run --preset tiny trained with tiny.yaml (seq_len 64, batch 8): {run['status']}")
PY
"$work/venv/bin/glmperf" report --runs-dir runs tiny -o report.html > /dev/null
test -s report.html
echo "wheel: glmperf report wrote $(wc -c < report.html) bytes"
