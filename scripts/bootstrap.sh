#!/usr/bin/env bash
# Creates or refreshes the local virtual environment used by `make demo` and `make test`.
#
# Where pip's configured find-links folder holds a CPU build of torch (as on the project's CI machines), that
# wheel is installed first, so that the package's plain `torch` requirement is already satisfied and pip never
# pulls the multi-gigabyte CUDA build. Elsewhere torch is installed as pip resolves it.
set -euo pipefail

VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
EXTRAS=${EXTRAS:-dev}

"$PYTHON" - <<'PY'
import sys
if sys.version_info < (3, 10):
    sys.exit(f"lightning-hetero needs Python >= 3.10, found {sys.version.split()[0]}")
PY

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)

cpu_torch_wheel() {
    local links
    links=$("$VENV/bin/python" -m pip --disable-pip-version-check config get global.find-links 2>/dev/null || true)
    for dir in ${links//file:\/\//}; do
        ls "$dir"/torch-*+cpu-*.whl 2>/dev/null | sort -V | tail -n 1
    done | tail -n 1
}

if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
    wheel=$(cpu_torch_wheel)
    if [ -n "$wheel" ]; then
        echo "bootstrap: installing the local CPU torch wheel $(basename "$wheel")"
        "${PIP[@]}" install "$wheel"
    fi
fi

echo "bootstrap: installing lightning-hetero[$EXTRAS] into $VENV"
"${PIP[@]}" install -e ".[$EXTRAS]"
