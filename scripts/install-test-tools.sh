#!/usr/bin/env bash
# Debian tools the infrastructure tests run for real: Prometheus (with promtool), the Pushgateway, chromium
# (headless, for the JupyterLab browser test), and Slurm with munge (a two-node cluster on this host, for
# tests/infra/test_slurm.py: the test starts the daemons itself; the packages start none).
# Installs them with apt-get when this is a Debian/Ubuntu machine and we are root (as in CI);
# elsewhere says what is missing, and those tests skip (they fail instead when CI=true).
set -u
need=()
command -v prometheus >/dev/null 2>&1 || need+=(prometheus)
command -v prometheus-pushgateway >/dev/null 2>&1 || command -v pushgateway >/dev/null 2>&1 || need+=(prometheus-pushgateway)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
has() { command -v "$1" >/dev/null 2>&1 || [ -x "/usr/sbin/$1" ]; }  # the daemons live in /usr/sbin
has slurmctld || need+=(slurmctld)
has slurmd || need+=(slurmd)
has munged || need+=(munge)
has sbatch || need+=(slurm-client)
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing ${need[*]} (Debian packages) for the infrastructure tests"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y --no-install-recommends "${need[@]}" >/dev/null 2>&1 \
    || { apt-get update -qq >/dev/null && apt-get install -y --no-install-recommends "${need[@]}" >/dev/null; } \
    || { echo "could not install ${need[*]}"; exit 1; }
else
  echo "note: ${need[*]} not installed (needs root and apt-get); the tests that need them will skip"
fi
