#!/usr/bin/env bash
# The one-command device check (make gpu-check): every GPU path of the lab on this host, a table last,
# within a deadline.
#
#   scripts/gpu-check.sh [--quick] [--allow-cpu] [--deadline SECONDS] [--only STEP ...] [OUT_DIR]
#
# OUT_DIR (default runs/gpu-check): step logs, runs, gpu-check.json. --deadline bounds the whole script, this
# wrapper's own seconds included (default: what every step this host can run is expected to take, over 0.75). --quick --allow-cpu: every step a CPU can run, at toy sizes.
# Needs a Python with torch, torchvision, PyYAML and numpy (an NGC PyTorch container has them; .venv when
# `make setup` made one); steps that need more (prometheus_client, lightning, deepspeed) say so and are not run.
# No venv, no network: the lab is pure Python and runs from this checkout. Wheels in ./wheels (or
# $GPU_CHECK_WHEELS) of packages this Python lacks, DeepSpeed's for instance, are installed into
# OUT_DIR/site-packages first (docs/benchmarks.md: make gpu-check). Without a GPU it says so, no step applies, exit 0.
# Exit 1: a step failed; 4: incomplete (a step not run: the deadline, --only, a missing package).
set -euo pipefail
cd "$(dirname "$0")/.."
usage="usage: scripts/gpu-check.sh [--quick] [--allow-cpu] [--deadline SECONDS] [--only STEP ...] [OUT_DIR]"
flags=()
deadline=""
out=""
while [ $# -gt 0 ]; do
    case "$1" in
        --quick|--allow-cpu) flags+=("$1") ;;
        --deadline)
            [ $# -ge 2 ] || { echo "gpu-check: --deadline needs a number of seconds; $usage" >&2; exit 2; }
            deadline="$2"; shift ;;
        --deadline=*) deadline="${1#--deadline=}" ;;
        --only)  # one step of the check (repeat the option for several); `lab gpu-check` checks the name
            [ $# -ge 2 ] || { echo "gpu-check: --only needs a step's name; $usage" >&2; exit 2; }
            flags+=(--only "$2"); shift ;;
        -*) echo "gpu-check: unknown option $1; $usage" >&2; exit 2 ;;
        *)
            [ -z "$out" ] || { echo "gpu-check: one OUT_DIR only (got $out and $1); $usage" >&2; exit 2; }
            out="$1" ;;
    esac
    shift
done
out="${out:-runs/gpu-check}"
case "$deadline" in
    '') ;;
    *[!0-9]*) echo "gpu-check: --deadline: $deadline is not a whole number of seconds; use e.g. 360" >&2; exit 2 ;;
esac
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
need = ["torch", "torchvision", "yaml", "numpy"]
print(" ".join(n for n in need if importlib.util.find_spec(n) is None))
PY
)
if [ -n "$missing" ]; then
    echo "gpu-check: $python lacks: $missing (pip install torch torchvision PyYAML numpy, or make setup)" >&2
    exit 2
fi
mkdir -p "$out"
# Wheels of what this Python lacks (chosen by lab.machine.devicecheck.wheels, which names unmet requirements), installed
# beside the results: nothing on the host changes, and the next run chooses them again.
wheels="${GPU_CHECK_WHEELS:-wheels}"
if [ -d "$wheels" ]; then
    mapfile -t chosen < <("$python" -m lab.machine.devicecheck.wheels "$wheels")
    if [ "${#chosen[@]}" -gt 0 ]; then
        names=$(printf '%s\n' "${chosen[@]##*/}" | sed 's/-.*//' | paste -sd' ' -)
        site="$out/site-packages"
        [[ "$site" = /* ]] || site="$PWD/$site"
        if ! "$python" -m pip --version >/dev/null 2>&1; then
            echo "gpu-check: not installing $names from $wheels: $python has no pip (python -m pip); the steps" \
                 "that need them are not run" >&2
        elif "$python" -m pip install --quiet --disable-pip-version-check --no-index --no-deps --upgrade \
                --target "$site" "${chosen[@]}" >"$out/wheels.log" 2>&1; then
            echo "gpu-check: installed $names from $wheels into $site"
            export PYTHONPATH="$PYTHONPATH:$site"
        else
            echo "gpu-check: could not install $names from $wheels (see $out/wheels.log); the steps that need" \
                 "them are not run" >&2
        fi
    fi
fi
deadline_args=()
if [ -n "$deadline" ]; then
    left=$((deadline - SECONDS))
    deadline_args=(--deadline "$((left > 1 ? left : 1))")
fi
exec "$python" -m lab gpu-check --out "$out" --skip-without-gpu ${deadline_args[@]+"${deadline_args[@]}"} \
    ${flags[@]+"${flags[@]}"}
