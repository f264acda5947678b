#!/usr/bin/env bash
# The one-command device check (make gpu-check): every GPU path of the lab on this host, a table last.
#
#   scripts/gpu-check.sh [OUT_DIR]            # default runs/gpu-check: step logs, runs, gpu-check.json
#
# Needs a Python with torch, torchvision, PyYAML, numpy, tqdm, matplotlib and prometheus_client (an NGC
# PyTorch container has them; .venv when `make setup` made one). No venv, no network, nothing installed:
# the lab is pure Python and runs from this checkout. Without a GPU it says so, lists what it skipped, exit 0.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-runs/gpu-check}"
# PYTHON when given; else the first of .venv's and python3 whose torch sees a GPU (a venv's PyPI torch may
# need a newer driver than the host's, an NGC container's python3 matches its driver); else the first
# that has torch at all, for the dry check.
if [ -n "${PYTHON:-}" ]; then
    python="$PYTHON"
else
    candidates=()
    [ -x .venv/bin/python ] && candidates+=(.venv/bin/python)
    candidates+=(python3)
    python=""
    for candidate in "${candidates[@]}"; do
        if "$candidate" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
            python="$candidate"; break
        fi
    done
    if [ -z "$python" ]; then
        for candidate in "${candidates[@]}"; do
            if "$candidate" -c 'import torch' 2>/dev/null; then python="$candidate"; break; fi
        done
    fi
    python="${python:-python3}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
missing=$("$python" - <<'PY'
import importlib.util
need = ["torch", "torchvision", "yaml", "numpy", "tqdm", "matplotlib", "prometheus_client"]
print(" ".join(n for n in need if importlib.util.find_spec(n) is None))
PY
)
if [ -n "$missing" ]; then
    echo "gpu-check: $python lacks: $missing (pip install torch torchvision PyYAML numpy tqdm matplotlib" \
         "prometheus_client, or make setup)" >&2
    exit 2
fi
exec "$python" -m lab bench gpu-check --out "$out" --skip-without-gpu
