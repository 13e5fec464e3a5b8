"""scripts/gpu_check.sh: on a machine without CUDA it stops at once, saying why, before installing anything."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu_check.sh"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_without_cuda_the_check_says_so_and_stops():
    result = subprocess.run(
        ["bash", str(SCRIPT)], env=dict(os.environ, PYTHON=sys.executable), capture_output=True, text=True, timeout=60
    )
    assert result.returncode != 0
    assert "sees no CUDA device" in result.stderr
