#!/usr/bin/env bash
# A private Docker engine and a local base image for the real container test (tests/infra/test_container.py).
#
#   scripts/container-base.sh start   # prints DOCKER_HOST=... and BASE_IMAGE=... on its last two lines
#   scripts/container-base.sh stop    # stops the engine this script started (its data root stays, as a cache)
#   scripts/container-base.sh clean   # stops it and deletes the data root (~45 s for the ~6 GB it holds)
#
# No image registry is reachable from the machines this project is tested on, so nothing is pulled:
# - the engine is Debian's docker.io, started with its own data root, exec root and socket, no iptables
#   and no default bridge, so it touches nothing of the host's networking or of another engine;
# - the base image is a debootstrapped Debian bookworm (python3 3.11) plus /opt/venv holding the torch and
#   torchvision this checkout's .venv already has (hard links, no second download), imported with
#   `docker import`: a stand-in for the NGC image, which ships its own torch. The lab image is then built
#   from images/Dockerfile with BASE_IMAGE overridden, by its normal path (keep the base's torch).
#
# Exit status 77 with a line "skip: <reason>" means this machine cannot run the engine (not root, no
# apt-get, no debootstrap mirror, ...); the test skips with that reason. Anything else non-zero is a failure.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
STATE=${LAB_CONTAINER_DIR:-$ROOT/build/container}          # data root and rootfs: a cache, gitignored (/build/)
PY=${LAB_PYTHON:-$ROOT/.venv/bin/python}                   # the venv whose torch the base image reuses
# Unix socket paths are limited to 108 bytes: the socket and exec root live under a short /tmp path.
RUNDIR=/tmp/lab-docker-$(printf %s "$STATE" | md5sum | cut -c1-10)
SOCK=$RUNDIR/docker.sock
PIDFILE=$RUNDIR/dockerd.pid
SUITE=bookworm
BASE_REVISION=2   # bump when the base image's recipe changes: a cached engine then builds the new one

skip() { echo "skip: $*"; exit 77; }
say() { echo "container-base: $*" >&2; }

engine_running() { [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null && [ -S "$SOCK" ]; }

unmount_under() {
  # Deepest first; a lazy unmount where a plain one is refused (still busy).
  [ -d "$1" ] || return 0
  awk -v p="$1/" 'index($2, p) == 1 {print $2}' /proc/mounts | sort -r | while read -r point; do
    umount "$point" 2>/dev/null || umount -l "$point" 2>/dev/null || say "could not unmount $point"
  done
}

stop_engine() {
  if [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
    local pid; pid=$(cat "$PIDFILE")
    kill "$pid"
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
    say "dockerd $pid stopped"
  fi
  rm -f "$PIDFILE"
}

debian_mirror() {
  # The Debian mirror this machine's apt already uses (deb822 .sources or a classic sources.list line).
  local uri
  uri=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/*.sources 2>/dev/null | grep -v security | head -n1 || true)
  if [ -z "$uri" ]; then
    uri=$(awk '$1 == "deb" && $0 !~ /security/ {for (i = 2; i <= NF; i++) if ($i ~ /^https?:/) {print $i; exit}}' \
      /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null | head -n1 || true)
  fi
  echo "${uri:-http://deb.debian.org/debian}"
}

install_tools() {
  local need=()
  command -v dockerd >/dev/null 2>&1 || need+=(docker.io)
  command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
  [ ${#need[@]} -eq 0 ] && return 0
  [ "$(id -u)" = 0 ] || skip "the Docker engine needs root (to apt-get install ${need[*]} and run dockerd); uid is $(id -u)"
  command -v apt-get >/dev/null 2>&1 || skip "no apt-get on this machine to install ${need[*]}"
  say "apt-get install ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y --no-install-recommends "${need[@]}" >/dev/null 2>&1 \
    || { apt-get update -qq >/dev/null 2>&1 && apt-get install -y --no-install-recommends "${need[@]}" >/dev/null; } \
    || skip "apt-get could not install ${need[*]}"
}

start_engine() {
  engine_running && return 0
  [ "$(id -u)" = 0 ] || skip "dockerd needs root; uid is $(id -u)"
  mkdir -p "$STATE/docker" "$RUNDIR/exec"
  rm -f "$SOCK"
  say "starting dockerd (data root $STATE/docker, socket $SOCK)"
  # No iptables rules and no default bridge: compose's own network is a plain bridge the host can reach;
  # build steps use the host's network (compose's build.network: host in the test override).
  dockerd --data-root "$STATE/docker" --exec-root "$RUNDIR/exec" --pidfile "$PIDFILE" -H "unix://$SOCK" \
    --iptables=false --ip6tables=false --bridge=none >"$STATE/dockerd.log" 2>&1 &
  for _ in $(seq 1 150); do
    [ -S "$SOCK" ] && DOCKER_HOST=unix://$SOCK docker version >/dev/null 2>&1 && return 0
    sleep 0.2
  done
  tail -n 20 "$STATE/dockerd.log" >&2
  echo "dockerd did not answer on $SOCK within 30 s" >&2
  exit 1
}

torch_tag() {
  "$PY" -c 'import importlib.metadata as m; print("torch" + m.version("torch").split("+")[0])'
}

link_torch_stack() {
  # Hard-link torch, torchvision and pip, with every distribution they need (markers and extras evaluated),
  # from the venv's site-packages into ROOTFS/opt/venv: seconds, no disk, no download.
  local rootfs=$1
  "$PY" - "$rootfs" <<'EOF'
import importlib.metadata as md
import os
import sys
from pathlib import Path

from pip._vendor.packaging.requirements import Requirement
from pip._vendor.packaging.utils import canonicalize_name

rootfs = Path(sys.argv[1])
seen: dict[str, set[str]] = {}
todo = [("torch", frozenset()), ("torchvision", frozenset()), ("pip", frozenset())]
while todo:
    name, extras = todo.pop()
    key = canonicalize_name(name)
    if key in seen and extras <= seen[key]:
        continue
    seen.setdefault(key, set()).update(extras)
    for spec in md.requires(name) or []:
        req = Requirement(spec)
        if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in (extras or {""})):
            todo.append((req.name, frozenset(req.extras)))
site = Path(md.distribution("torch").locate_file("")).resolve()
target = rootfs / "opt/venv/lib/python3.11/site-packages"
count = 0
for key in sorted(seen):
    dist = md.distribution(key)
    for f in dist.files or []:
        src = Path(dist.locate_file(f)).resolve()
        try:
            rel = src.relative_to(site)
        except ValueError:  # console scripts in bin/: the image calls `python3 -m pip`
            continue
        if not src.is_file():
            continue
        dst = target / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if not dst.exists():
            try:
                os.link(src, dst)
            except OSError:  # another file system: copy instead
                dst.write_bytes(src.read_bytes())
                os.chmod(dst, src.stat().st_mode)
            count += 1
print(f"{len(seen)} distributions, {count} files", file=sys.stderr)
EOF
  mkdir -p "$rootfs/opt/venv/bin"
  ln -sf /usr/bin/python3 "$rootfs/opt/venv/bin/python3"
  ln -sf python3 "$rootfs/opt/venv/bin/python"
  printf 'home = /usr/bin\ninclude-system-site-packages = false\nversion = 3.11\n' >"$rootfs/opt/venv/pyvenv.cfg"
}

make_base_image() {
  local tag=$1
  DOCKER_HOST=unix://$SOCK docker image inspect "$tag" >/dev/null 2>&1 && return 0
  local host_py debian_py rootfs="$STATE/rootfs"
  host_py=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  [ "$host_py" = 3.11 ] || skip "the base image reuses $PY's torch, which is for Python $host_py; Debian $SUITE's python3 is 3.11"
  if [ ! -x "$rootfs/usr/bin/python3" ]; then
    rm -rf "$rootfs"
    local mirror; mirror=$(debian_mirror)
    say "debootstrap $SUITE (minbase + python3) from $mirror"
    debootstrap --variant=minbase --include=python3 "$SUITE" "$rootfs.tmp" "$mirror" >"$STATE/debootstrap.log" 2>&1 \
      || { tail -n 5 "$STATE/debootstrap.log" >&2; skip "debootstrap from $mirror failed (see $STATE/debootstrap.log)"; }
    rm -rf "$rootfs.tmp/var/cache/apt/archives"/*.deb
    mv "$rootfs.tmp" "$rootfs"
  fi
  debian_py=$("$rootfs/usr/bin/python3" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || echo 3.11)
  [ "$debian_py" = "$host_py" ] || skip "Debian $SUITE's python3 is $debian_py, the venv's is $host_py"
  rm -rf "$rootfs/opt/venv"
  # The host's CA bundle, as a site's own base image would carry it: pip inside the build then trusts the
  # same TLS chain as pip on this machine (here PyPI is reached through a proxy with its own CA).
  local bundle=${PIP_CERT:-${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}}
  local cert_env=()
  if [ -f "$bundle" ]; then
    install -D -m 0644 "$bundle" "$rootfs/etc/ssl/certs/ca-certificates.crt"
    cert_env=(-c 'ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt' -c 'ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt')
  fi
  say "linking torch and torchvision from $PY into the root file system"
  link_torch_stack "$rootfs"
  say "docker import $tag"
  tar -C "$rootfs" -c . | DOCKER_HOST=unix://$SOCK docker import \
    -c 'ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    -c 'ENV LANG=C.UTF-8' "${cert_env[@]}" - "$tag" >/dev/null
  rm -rf "$rootfs/opt/venv"   # the links cost nothing, but the venv may be rebuilt: keep the rootfs plain
}

case "${1:-start}" in
  start)
    mkdir -p "$STATE"
    install_tools
    start_engine
    tag="local/lab-base:$SUITE-$(torch_tag)-r$BASE_REVISION"
    make_base_image "$tag"
    echo "DOCKER_HOST=unix://$SOCK"
    echo "BASE_IMAGE=$tag"
    ;;
  stop) stop_engine ;;
  clean)
    stop_engine
    # A stopped dockerd leaves its default network namespace mounted (exec root's netns/default, nsfs): rm
    # cannot remove a mount point, so everything mounted under the engine's folders is unmounted first.
    unmount_under "$RUNDIR"
    unmount_under "$STATE"
    rm -rf "$STATE/docker" "$STATE/rootfs" "$STATE/rootfs.tmp"
    rm -rf "$RUNDIR" 2>/dev/null || say "left $RUNDIR (a mount under it is still busy; it holds no data)"
    ;;
  *) echo "usage: $0 start|stop|clean" >&2; exit 2 ;;
esac
