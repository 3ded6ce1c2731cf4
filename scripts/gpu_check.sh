#!/usr/bin/env bash
# The CUDA paths end to end, on any CUDA machine, in under 10 minutes: real NVML readings
# (recorded into tests/data/nvml_replay/), CUDA-event step timing, the allocator snapshot,
# the torch.profiler trace with kernels, `glmperf plan` beside the allocator's peak, and NCCL (DDP,
# fsdp=2 holding half of DDP's states) when the machine has two GPUs or more.
# It prints what it measured; copy the figures into docs/BENCHMARKS.md.
#   scripts/gpu_check.sh [OUT_DIR]     (uses .venv/bin/python if present, else $PYTHON or python3)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] && PY=.venv/bin/python
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
out=${1:-${OUT:-$(mktemp -d)}}
mkdir -p "$out"
"$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA device: nothing to check')"
"$PY" scripts/gpu_check_nvml.py --out "$out"
cp "$out"/recorded_*.json tests/data/nvml_replay/ 2>/dev/null || true
status=0
"$PY" scripts/gpu_check.py --runs-dir "$out/runs" || status=$?
# The advice proven on a GPU-shaped preset: tune from its plain fp32 config (no autocast, no
# compile), each round's candidates probed on the GPU, and say what it adopted and what each
# probe expected against what its verification measured; the budgets keep the script inside 10 minutes.
glmperf() { "$PY" -c 'import sys; from profiler.cli import main; sys.exit(main())' "$@"; }
glmperf tune --preset glm-350m --set switches.amp=off --steps 20 --repeats 2 --probe-budget 60 \
    --time-budget-min "${TUNE_MINUTES:-3}" --runs-dir "$out/runs" --output "$out/tuned.yaml" --no-progress
"$PY" - "$out/runs" <<'PY'
import json, sys
from pathlib import Path
for record in Path(sys.argv[1]).glob("tunes/*/tune.json"):
    for e in json.loads(record.read_text())["rounds"]:
        exp, m = e.get("expected") or {}, e["result"].get("measured") or {}
        tps = exp.get("tokens_per_s") or {}
        probed = f"{tps['low']:+.1f}% to {tps['high']:+.1f}% ({exp.get('source')})" if tps else "-"
        verified = f"{m['change_pct']:+.1f}% [{m['low_pct']:+.1f}%, {m['high_pct']:+.1f}%]" if "change_pct" in m else "-"
        print(f"probe vs verification: {e['tried']}: expected {probed}, verified {verified} ({e['result']['verdict']})")
PY
exit "$status"
