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
python="${PYTHON:-python3}"
if [ -x .venv/bin/python ] && [ -z "${PYTHON:-}" ]; then python=.venv/bin/python; fi
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
