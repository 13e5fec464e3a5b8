#!/usr/bin/env bash
# The one-command GPU check: on a machine with CUDA, run the CUDA tests and the GPU benchmark, and write
# benchmarks/results/gpu/*.json plus a table. Installs nothing beyond the project and its own extras ([dev]);
# the CUDA torch already installed is kept (pinned by a constraint).
#
#   scripts/gpu_check.sh            # tests marked `cuda`, then benchmarks/bench_gpu.py (10 cases x 3 seeds)
#   scripts/gpu_check.sh --quick    # tests, then a 1-epoch, 1-seed benchmark
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python}

"$PYTHON" - <<'PY'
import sys, torch
if not torch.cuda.is_available():
    sys.exit(f"gpu_check: torch {torch.__version__} sees no CUDA device; run this on a machine with a GPU")
print(f"gpu_check: torch {torch.__version__}, {torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}")
PY

# the project with its [dev] extra; the CUDA torch already installed is pinned, so pip cannot replace it
constraint=$(mktemp)
"$PYTHON" -c 'import torch; print(f"torch=={torch.__version__}")' > "$constraint"
"$PYTHON" -m pip install --quiet -e ".[dev]" --constraint "$constraint"
rm -f "$constraint"

"$PYTHON" -m pytest -q -m cuda tests src/lightning_hetero -p no:cacheprovider

epochs=5 seeds=3
[[ "${1:-}" == "--quick" ]] && epochs=1 seeds=1
mkdir -p benchmarks/results/gpu
"$PYTHON" benchmarks/bench_gpu.py --device cuda --epochs "$epochs" --seeds "$seeds" | tee benchmarks/results/gpu/table.txt
echo "gpu_check: results in benchmarks/results/gpu/ (summary.json, table.txt); commit them"
