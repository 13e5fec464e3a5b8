#!/usr/bin/env bash
# The one-command GPU check: on a machine with CUDA, run the CUDA tests and the GPU benchmark, and write
# benchmarks/results/gpu/*.json plus a table. Installs nothing beyond the project's own extras ([dev]), and only
# when something is missing; the CUDA torch already installed is kept (pinned by a constraint).
#
#   scripts/gpu_check.sh              # tests marked `cuda`, then `python -m benchmarks run gpu` (10 cases x 3 seeds), BSP
#                                     # against DDP on 16 distinct layers (bsp_ddp/), then local SGD's 4-worker CPU cell
#                                     # on the machine's CPUs (8 cores or more)
#   scripts/gpu_check.sh --quick      # tests, then a 1-epoch, 1-seed benchmark (about 5 minutes on one GPU)
#   scripts/gpu_check.sh --dry-run    # without a GPU: every step on the CPU (the `cuda` tests skip, the benchmark's
#                                     # smallest case), into benchmarks/results/gpu_dry_run/; installs nothing
#   scripts/gpu_check.sh --out DIR    # write the results to DIR instead of benchmarks/results/gpu
#   PYTHON=/path/to/python scripts/gpu_check.sh   # the interpreter whose CUDA torch to use (default: python, python3)
#
# Every step has a time limit (seconds: GPU_CHECK_INSTALL_S=900, GPU_CHECK_TESTS_S=900, GPU_CHECK_BENCH_S=5400,
# GPU_CHECK_CASE_S=600 for one benchmark run). A step that fails or runs out of time is reported and the next one
# still runs; the exit status is 1 if any did. Written: tests.json (each `cuda` test's outcome), the benchmark's
# <case>_s<seed>.json and summary.json, table.txt, local_sgd_cpu.json (the CPU cell), and check.json (each step's
# status and seconds).
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-$(command -v python || command -v python3)}
INSTALL_S=${GPU_CHECK_INSTALL_S:-900}
TESTS_S=${GPU_CHECK_TESTS_S:-900}
BENCH_S=${GPU_CHECK_BENCH_S:-5400}
CASE_S=${GPU_CHECK_CASE_S:-600}

mode=full out=""
while [ $# -gt 0 ]; do
    case "$1" in
        --quick) mode=quick ;;
        --dry-run) mode=dry-run ;;
        --out) out=${2:?--out needs a directory}; shift ;;
        *) echo "usage: $0 [--quick | --dry-run] [--out DIR]" >&2; exit 2 ;;
    esac
    shift
done
[ -n "$out" ] || out=benchmarks/results/$([ "$mode" = dry-run ] && echo gpu_dry_run || echo gpu)

log() { printf 'gpu_check: %s\n' "$*"; }
steps=()  # "name status seconds" per step, for check.json
failed=0
# step NAME LIMIT_S COMMAND...: run COMMAND under `timeout`, record its status and time
step() {
    local name=$1 limit=$2 start status
    shift 2
    start=$(date +%s)
    log "$name (limit ${limit} s)"
    timeout -k 30 "$limit" "$@"
    status=$?
    [ "$status" -eq 124 ] || [ "$status" -eq 137 ] && log "$name ran past ${limit} s and was stopped"
    [ "$status" -ne 0 ] && failed=1 && log "$name failed (exit $status)"
    steps+=("$name $status $(($(date +%s) - start))")
    return "$status"
}

# 1. A CUDA device (the dry run goes on without one)
if ! step cuda 120 "$PYTHON" -c '
import sys, torch
if not torch.cuda.is_available():
    sys.exit(f"gpu_check: torch {torch.__version__} sees no CUDA device; run this on a machine with a GPU")
print(f"gpu_check: torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}")
'; then
    [ "$mode" = dry-run ] || exit 1
    failed=0 && log "dry run: going on without CUDA, on the CPU"
fi
mkdir -p "$out" && out=$(cd "$out" && pwd)

# 2. What the tests and the benchmark import; pip only for what is missing (the project's [dev] extra), with
# short network timeouts so that a machine without an index fails in seconds rather than retrying for minutes
missing() {
    "$PYTHON" - <<'PY'
import importlib.util
need = ["torch", "lightning", "torchmetrics", "omegaconf", "docker", "pytest", "pytest_timeout", "hypothesis"]
print(" ".join(name for name in need if importlib.util.find_spec(name) is None))
PY
}
absent=$(missing)
if [ -n "$absent" ] && [ "$mode" != dry-run ]; then
    log "missing: $absent; installing the project with its [dev] extra (torch pinned as installed)"
    constraint=$(mktemp)
    "$PYTHON" -c 'import torch; print(f"torch=={torch.__version__}")' > "$constraint"
    step install "$INSTALL_S" "$PYTHON" -m pip install --quiet --timeout 20 --retries 1 -e ".[dev]" \
        --constraint "$constraint"
    rm -f "$constraint"
    absent=$(missing)
fi
if [ -n "$absent" ]; then
    log "cannot run without: $absent (pip install -e '.[dev]', or PIP_FIND_LINKS=<a folder of wheels> with PIP_NO_INDEX=1)"
    exit 1
fi
# the project from this checkout when it is not installed (it is pure Python; the tests' scripts inherit this)
if ! "$PYTHON" -c 'import lightning_hetero' 2>/dev/null; then
    export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
    log "lightning_hetero is not installed: using $PWD/src"
fi

# 3. The tests marked `cuda` (only their files are collected: a module another extra needs cannot stop them).
# Among them ElasticHeteroBatchStrategy's cell: three worker processes sharing the GPU train two epochs and must end
# with the parameters of one process trained on the same global batches; it needs torchft (the [elastic] extra).
mapfile -t cuda_files < <(grep -rl --include='test_*.py' 'pytest.mark.cuda' tests | sort)
"$PYTHON" -c 'import torchft' 2>/dev/null || log "torchft missing: the elastic cuda tests skip (pip install -e '.[elastic]')"
step tests "$TESTS_S" "$PYTHON" -m pytest -q -m cuda "${cuda_files[@]}" -p no:cacheprovider \
    --continue-on-collection-errors -rA --junitxml="$out/tests.xml"
"$PYTHON" - "$out" <<'PY' || { failed=1; log "tests.json not written"; }
import json, sys, xml.etree.ElementTree as ET
from pathlib import Path
out = Path(sys.argv[1])
tests = []
for case in ET.parse(out / "tests.xml").getroot().iter("testcase"):
    outcome = next((child.tag for child in case if child.tag in ("failure", "error", "skipped")), "passed")
    detail = next((child.get("message", "") for child in case if child.tag in ("failure", "error", "skipped")), "")
    tests.append({"test": f"{case.get('classname')}::{case.get('name')}", "outcome": outcome,
                  "seconds": float(case.get("time", 0)), "detail": detail[:500]})
(out / "tests.json").write_text(json.dumps(tests, indent=1))
counts = {o: sum(t["outcome"] == o for t in tests) for o in ("passed", "failed", "error", "skipped")}
print(f"gpu_check: cuda tests: {', '.join(f'{n} {o}' for o, n in counts.items())} (tests.json)")
PY

# 4. The benchmark (every run has its own limit; summary.json is rewritten after each, so a cut keeps what ran)
case "$mode" in
    full) bench=(--device cuda --epochs 5 --seeds 3) ;;
    quick) bench=(--device cuda --epochs 1 --seeds 1) ;;
    dry-run) bench=(--device cpu --cases hetero --epochs 1 --seeds 1 --samples 1280) ;;
esac
step benchmark "$BENCH_S" "$PYTHON" -m benchmarks run gpu "${bench[@]}" --out "$out" --case-timeout-s "$CASE_S"

# 5. BSP against DDP on a network of 16 distinct layers, where DDP's bucketed all-reduce overlaps backward: the goal
# is BSP at 0.98 of DDP's throughput or more (summary.json: goals.bsp_of_ddp, medians over seeds)
case "$mode" in
    full) overlap=(--device cuda --epochs 2 --seeds 3) ;;
    quick) overlap=(--device cuda --epochs 1 --seeds 1) ;;
    dry-run) overlap=(--device cpu --epochs 1 --seeds 1 --samples 640) ;;
esac
step bsp_ddp "$BENCH_S" "$PYTHON" -m benchmarks run gpu "${overlap[@]}" --cases ddp,bsp --layers 16 \
    --out "$out/bsp_ddp" --case-timeout-s "$CASE_S"

# 6. A CPU cell the project's 2-core host cannot settle: local SGD, 4 workers at HL4, the light model. Its 4
# CPU-bound processes need 4 cores; on 2 the summed standalone bound is the cores' capacity and the strategy's own
# CPU comes off it (docs/results.md, Local SGD). The GPU machine's CPUs measure it; under 8 cores it is skipped.
case "$mode" in
    dry-run) cell=(--quick) ;;
    *) cell=(--classes 256 --noise 1.5 --standalone-s 6 --seeds 0,1,2 --configs local_prop --workers 4 --hl 4
        --breakdown) ;;
esac
if [ "$mode" = dry-run ] || [ "$(nproc)" -ge 8 ]; then
    step local_sgd_cpu "$CASE_S" "$PYTHON" -m benchmarks run local_sgd "${cell[@]}" --out "$out/local_sgd_cpu.json"
else
    log "local_sgd_cpu skipped: $(nproc) cores, the 4-worker cell needs 8"
fi

"$PYTHON" - "$out" "$mode" "${steps[@]}" <<'PY'
import json, sys
from pathlib import Path
out, mode, steps = Path(sys.argv[1]), sys.argv[2], [s.split() for s in sys.argv[3:]]
check = {"mode": mode, "steps": [{"step": n, "exit": int(e), "seconds": int(t)} for n, e, t in steps]}
(out / "check.json").write_text(json.dumps(check, indent=1))
PY
log "results in $out (tests.json, summary.json, table.txt, bsp_ddp/, local_sgd_cpu.json, check.json)$([ "$mode" = dry-run ] || echo '; commit them')"
exit "$failed"
