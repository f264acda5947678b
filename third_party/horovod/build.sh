#!/usr/bin/env bash
# Horovod for the lab (dist.strategy=horovod): its last release, 0.28.1, from the package registry's sdist, with the
# lab's patches (patches/, each says why), built into a wheel against the torch that PYTHON imports, cached by
# Horovod, torch and Python version and flavour, and installed into that Python with horovodrun's own needs.
#
#   third_party/horovod/build.sh [PYTHON]        # default .venv/bin/python; `make horovod` runs this
#
# The flavour: NCCL where a CUDA toolkit (nvcc) and NCCL's header are found (the NGC image), else CPU/gloo.
# HOROVOD_FLAVOUR=cpu or nccl chooses. LAB_HOROVOD_CACHE is the cache folder (default ~/.cache/lab/horovod).
# A cached wheel installs in seconds; a build takes about 2 minutes on 2 cores. Never a git URL: the sdist
# the registry serves is what was read and patched.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
python=${1:-.venv/bin/python}
version=0.28.1
[ -x "$python" ] || command -v "$python" >/dev/null 2>&1 || { echo "build.sh: $python: no such Python; give the venv's, e.g. .venv/bin/python" >&2; exit 2; }
torch=$("$python" -c 'import torch; print(torch.__version__)' 2>/dev/null) \
  || { echo "build.sh: $python cannot import torch; Horovod builds against the installed torch: make setup first" >&2; exit 2; }
pytag=$("$python" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')

nccl_header() {  # NCCL's header where the NGC image and the usual packages put it
  local d
  for d in "${NCCL_HOME:-/nonexistent}/include" /usr/include /usr/local/include /usr/local/cuda/include; do
    [ -f "$d/nccl.h" ] && { echo "$d"; return 0; }
  done
  return 1
}
flavour=${HOROVOD_FLAVOUR:-}
if [ -z "$flavour" ]; then
  if command -v nvcc >/dev/null 2>&1 && nccl_header >/dev/null; then flavour=nccl; else flavour=cpu; fi
fi
case $flavour in
  cpu|nccl) ;;
  *) echo "build.sh: HOROVOD_FLAVOUR=$flavour; use cpu or nccl" >&2; exit 2 ;;
esac

cache=${LAB_HOROVOD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/lab/horovod}/$version-torch$torch-$pytag-$flavour
constraints=()  # the lab's exact versions when this runs in a checkout (the image passes PIP_CONSTRAINT instead)
[ -f "$here/../../constraints.txt" ] && [ -z "${PIP_CONSTRAINT:-}" ] && constraints=(-c "$here/../../constraints.txt")
install() {
  # horovodrun's own imports (cloudpickle, psutil; PyYAML and packaging are the lab's already): the [horovod] extra
  "$python" -m pip install --quiet --no-deps "$1"
  "$python" -m pip install --quiet "${constraints[@]}" "cloudpickle>=3" "psutil>=5"
  echo "horovod $version ($flavour, torch $torch) installed into $python from $1"
}
wheel=$(ls "$cache"/horovod-*.whl 2>/dev/null | head -1 || true)
if [ -n "$wheel" ]; then
  install "$wheel"
  exit 0
fi

command -v cmake >/dev/null 2>&1 || "$python" -m pip install --quiet cmake  # Debian's, or PyPI's wheel
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$python" -m pip download --quiet --no-deps --no-binary :all: "horovod==$version" -d "$work"
tar xzf "$work/horovod-$version.tar.gz" -C "$work"
src=$work/horovod-$version
for patch in "$here"/patches/*.patch; do
  patch -d "$src" -p1 --forward --silent < "$patch" || { echo "build.sh: $(basename "$patch") does not apply to horovod $version" >&2; exit 1; }
done

export HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 HOROVOD_WITH_GLOO=1
export HOROVOD_WITHOUT_MPI=1  # horovodrun --gloo launches; the lab never needs MPI (docs/horovod.md)
export HOROVOD_CPU_OPERATIONS=GLOO
# Release: -O3 without debug information (patch 0003; Horovod's own RelWithDebInfo adds -g, most of the build's time)
export HOROVOD_CMAKE_BUILD_TYPE=${HOROVOD_CMAKE_BUILD_TYPE:-Release}
if [ "$flavour" = nccl ]; then
  export HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_NCCL_INCLUDE=$(nccl_header)
  export HOROVOD_BUILD_CUDA_CC_LIST=${HOROVOD_BUILD_CUDA_CC_LIST:-80,90}  # A100, H100/H200
fi
echo "building horovod $version ($flavour, $HOROVOD_CMAKE_BUILD_TYPE) against torch $torch with $(basename "$python") $pytag: about 2 minutes on 2 cores"
started=$(date +%s)
# Without a parent make's MAKEFLAGS: under `make -j` it names a jobserver whose pipes pip does not pass on, and
# Horovod's inner make then builds one file at a time ("jobserver unavailable: using -j1"; seen in make test: one
# core idle for the whole build); its own -j (every core) applies instead.
env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL "$python" -m pip wheel --quiet --no-build-isolation --no-deps "$src" -w "$work/wheel" > "$work/build.log" 2>&1 \
  || { grep -A6 "CMake Error\|error:" "$work/build.log" | head -40 >&2; tail -15 "$work/build.log" >&2; echo "build.sh: the horovod build failed (its log's end is above)" >&2; exit 1; }
echo "built in $(( $(date +%s) - started )) s"
mkdir -p "$cache"
built=$(ls "$work"/wheel/horovod-*.whl)
cp "$built" "$cache/.$(basename "$built").partial" && mv "$cache/.$(basename "$built").partial" "$cache/$(basename "$built")"
install "$cache/$(basename "$built")"
