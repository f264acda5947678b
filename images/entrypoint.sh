#!/bin/bash
# The lab image's entry point: NGC's own entry point first, where the base has one, then `lab "$@"`.
#
# /opt/nvidia/nvidia_entrypoint.sh sources the base's /opt/nvidia/entrypoint.d/ parts: the CUDA forward-
# compatibility set-up (the image's compat libraries go on LD_LIBRARY_PATH where the host driver is older than
# the image's CUDA, as on the long-term R535/R550 branches of DGX OS) and its checks and banner. ENTRYPOINT
# ["lab"] skipped all of it. Its banner goes to stderr here: stdout stays the lab's (`lab doctor --json -`
# prints JSON there for the Ansible preflight). Every step execs, so `lab` ends as the container's process
# (signals from `docker stop` and --init reach torchrun directly).
#
# On a base without NGC's script (the CPU image, the test image) this is `exec lab "$@"`.
# `lab-entrypoint --exec CMD ARGS` runs CMD instead of lab, after NGC's part all the same (compose's jupyter
# service: JupyterLab's kernels need the same CUDA set-up as the lab).
# LAB_NGC_ENTRYPOINT names another script (tests point it at a stand-in).
set -euo pipefail

if [ "${1-}" = --lab-after-ngc ]; then  # second stage, run by NGC's script: give the lab its stdout back
    shift
    exec 1>&9 9>&-
    if [ "${1-}" = --exec ]; then shift; exec "$@"; fi
    exec lab "$@"
fi

ngc=${LAB_NGC_ENTRYPOINT:-/opt/nvidia/nvidia_entrypoint.sh}
if [ -f "$ngc" ]; then
    exec 9>&1 1>&2  # fd 9 keeps stdout for the lab; NGC's banner and warnings go to stderr
    exec /bin/bash "$ngc" "$0" --lab-after-ngc "$@"
fi
if [ "${1-}" = --exec ]; then shift; exec "$@"; fi
exec lab "$@"
