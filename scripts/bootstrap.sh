#!/usr/bin/env bash
# Creates or refreshes the local virtual environment used by `make demo` and `make test`.
#
# Where pip's configured find-links (a config file's find-links, or PIP_FIND_LINKS) hold a CPU build of torch for
# this Python (as on the project's CI machines), that wheel is installed first, so that the package's plain `torch`
# requirement is already satisfied and pip never pulls the multi-gigabyte CUDA build. Elsewhere torch is installed
# as pip resolves it.
#
#   scripts/bootstrap.sh                    create or refresh $VENV (default .venv) with the $EXTRAS (default dev,elastic)
#   scripts/bootstrap.sh --print-cpu-wheel  print the CPU torch wheel the bootstrap would install (nothing if none)
#   scripts/bootstrap.sh --check-cpu-only   fail, naming them, if $VENV holds a CUDA torch or nvidia-* packages
set -euo pipefail

VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
EXTRAS=${EXTRAS:-dev,elastic}
HELPER="$(dirname "$0")/cpu_torch.py"

case "${1:-}" in
    --print-cpu-wheel)
        # the venv's Python when it exists: the wheel must match the interpreter it goes into
        if [ -x "$VENV/bin/python" ]; then exec "$VENV/bin/python" "$HELPER" wheel; fi
        exec "$PYTHON" "$HELPER" wheel ;;
    --check-cpu-only)
        exec "$VENV/bin/python" "$HELPER" check ;;
    "") ;;
    *)
        echo "usage: $0 [--print-cpu-wheel | --check-cpu-only]" >&2
        exit 2 ;;
esac

"$PYTHON" - <<'PY'
import sys
if sys.version_info < (3, 10):
    sys.exit(f"lightning-hetero needs Python >= 3.10, found {sys.version.split()[0]}")
PY

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)

if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
    wheel=$("$VENV/bin/python" "$HELPER" wheel)
    if [ -n "$wheel" ]; then
        echo "bootstrap: installing the local CPU torch wheel $(basename "$wheel")"
        "${PIP[@]}" install "$wheel"
    else
        echo "bootstrap: no CPU torch wheel in pip's find-links; pip will choose torch (on Linux, the CUDA build)"
    fi
fi

echo "bootstrap: installing lightning-hetero[$EXTRAS] into $VENV"
"${PIP[@]}" install -e ".[$EXTRAS]"
