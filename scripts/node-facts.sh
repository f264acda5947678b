#!/usr/bin/env bash
# What a node's own tools say about its GPUs, NVLink, InfiniBand and health, one file per fact, for `lab validate`
# to judge (lab/machine/health/node_facts.py parses them; docs/multi-node.md). Run on the node's HOST, not in a container:
# the driver's tools, the kernel's journal and the fabric manager's state are the host's.
#
#   scripts/node-facts.sh OUTDIR [DCGM_LEVEL]      # DCGM_LEVEL: dcgmi diag -r LEVEL (2 before a job, 3 acceptance;
#                                                  # 0 or none: not run)
#
# Needs bash and coreutils only. For every fact NAME it writes OUTDIR/NAME.txt (the command's stdout and stderr),
# OUTDIR/NAME.rc (its exit status: 127 when the tool is not installed) and OUTDIR/NAME.cmd (what ran). It never
# fails for a fact: a missing tool is written down, and the judge says "not present" rather than pass.
# NODE_FACTS_TIMEOUT (seconds, default 120) bounds each query; NODE_FACTS_DIAG_TIMEOUT (default 3600) the DCGM
# diagnostic (level 3 takes tens of minutes on 8 GPUs).
set -u

if [[ $# -lt 1 || $# -gt 2 || -z $1 ]]; then
  echo "usage: $0 OUTDIR [DCGM_LEVEL]  (DCGM_LEVEL 0-4; 0 or none: dcgmi diag is not run)" >&2
  exit 2
fi
out=$1
level=${2:-0}
if [[ ! $level =~ ^[0-4]$ ]]; then
  echo "$0: DCGM_LEVEL is '$level'; use 0 (not run), 1, 2 (before a job), 3 (acceptance) or 4" >&2
  exit 2
fi
mkdir -p "$out" || exit 2
query_timeout=${NODE_FACTS_TIMEOUT:-120}
diag_timeout=${NODE_FACTS_DIAG_TIMEOUT:-3600}

# bounded where coreutils' timeout exists: a hung nvidia-smi must not hang the check
bounded() {
  local seconds=$1; shift
  if command -v timeout >/dev/null 2>&1; then timeout "$seconds" "$@"; else "$@"; fi
}

# fact NAME COMMAND ARGS...: run it (when installed) into NAME.txt/.rc/.cmd
fact() {
  local name=$1; shift
  printf '%s\n' "$*" > "$out/$name.cmd"
  if ! command -v "$1" >/dev/null 2>&1; then
    echo "$1: not installed" > "$out/$name.txt"
    echo 127 > "$out/$name.rc"
    return
  fi
  bounded "$query_timeout" "$@" > "$out/$name.txt" 2>&1
  echo $? > "$out/$name.rc"
}

fact hostname hostname
fact kernel uname -r
fact nvidia-smi-gpus nvidia-smi --query-gpu=index,name,uuid,memory.total,pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,pcie.link.width.max --format=csv,noheader,nounits
fact nvidia-smi-q nvidia-smi -q
fact nvidia-smi-topo nvidia-smi topo -m
fact remapped-rows nvidia-smi --query-remapped-rows=gpu_bus_id,remapped_rows.correctable,remapped_rows.uncorrectable,remapped_rows.pending,remapped_rows.failure --format=csv,noheader
fact ecc nvidia-smi --query-gpu=index,ecc.errors.uncorrected.volatile.total --format=csv,noheader,nounits
fact ibstat ibstat
fact modules lsmod
fact fabricmanager systemctl is-active nvidia-fabricmanager
fact dcgmi-version dcgmi -v
# The last XID of each GPU as DCGM saw it (field 230, DCGM_FI_DEV_XID_ERRORS): readable without the journal's
# rights, which an ordinary Slurm user lacks
fact dcgm-xid dcgmi dmon -e 230 -c 1

# driver_fact NAME PATH COMMAND...: a fact the NVIDIA driver's procfs holds; "not present" where PATH is not there
driver_fact() {
  local name=$1 path=$2; shift 2
  printf '%s\n' "$*" > "$out/$name.cmd"
  if [[ -e $path ]]; then
    "$@" > "$out/$name.txt" 2>&1; echo $? > "$out/$name.rc"
  else
    echo "$path: not present (no NVIDIA driver loaded)" > "$out/$name.txt"; echo 127 > "$out/$name.rc"
  fi
}
# The driver's own banner: its version and whether it is the open kernel module (DMA-BUF needs the open one)
driver_fact driver-version /proc/driver/nvidia/version cat /proc/driver/nvidia/version
# The GPUs the driver has bound, from procfs: listed even where the step's cgroup (Slurm's ConstrainDevices, a job
# that asked for no GPUs) or a container hides their device files, so a step that sees none can be told apart
driver_fact driver-gpus /proc/driver/nvidia/gpus ls /proc/driver/nvidia/gpus

# Each InfiniBand port's state, rate and width from sysfs ("400 Gb/sec (4X NDR)": ibstat prints no width), and its
# link layer (an Ethernet port of a ConnectX is RoCE, not a rail of the IB fabric). No tool needed.
printf '%s\n' "read /sys/class/infiniband/*/ports/*/{state,phys_state,rate,link_layer}" > "$out/ib-width.cmd"
if [[ -d /sys/class/infiniband ]]; then
  : > "$out/ib-width.txt"
  for port in /sys/class/infiniband/*/ports/*; do
    [[ -d $port ]] || continue
    device=${port#/sys/class/infiniband/}; device=${device%%/*}
    printf '%s port %s: state=%s; phys_state=%s; rate=%s; link_layer=%s\n' "$device" "${port##*/}" \
      "$(cat "$port/state" 2>&1)" "$(cat "$port/phys_state" 2>&1)" "$(cat "$port/rate" 2>&1)" \
      "$(cat "$port/link_layer" 2>&1)" >> "$out/ib-width.txt"
  done
  echo 0 > "$out/ib-width.rc"
else
  echo "/sys/class/infiniband: not present (no RDMA driver loaded)" > "$out/ib-width.txt"
  echo 127 > "$out/ib-width.rc"
fi

# The NVSwitches the driver sees (HGX/DGX boards; none on PCIe cards)
printf '%s\n' "ls /dev/nvidia-nvswitch*" > "$out/nvswitch.cmd"
shopt -s nullglob
switches=(/dev/nvidia-nvswitch*)
shopt -u nullglob
printf '%s\n' "${switches[@]}" > "$out/nvswitch.txt"
echo 0 > "$out/nvswitch.rc"

# DCGM's diagnostic at the asked level (2: the usual pre-job check, minutes; 3: acceptance, tens of minutes)
printf '%s\n' "dcgmi diag -r $level" > "$out/dcgmi-diag.cmd"
if [[ $level == 0 ]]; then
  echo "not run (DCGM_LEVEL 0)" > "$out/dcgmi-diag.txt"; echo 0 > "$out/dcgmi-diag.rc"
elif ! command -v dcgmi >/dev/null 2>&1; then
  echo "dcgmi: not installed" > "$out/dcgmi-diag.txt"; echo 127 > "$out/dcgmi-diag.rc"
else
  bounded "$diag_timeout" dcgmi diag -r "$level" > "$out/dcgmi-diag.txt" 2>&1
  echo $? > "$out/dcgmi-diag.rc"
fi
echo "$level" > "$out/dcgm-level.txt"

# XIDs since boot: the kernel journal's NVRM lines. Read without journal rights, journalctl -q prints nothing and
# exits 0, which would read as "0 XIDs": journal-kernel-lines counts the kernel lines it could read at all (a
# booted kernel always logged some), so the judge can say "unreadable" instead.
printf '%s\n' "journalctl -k -b --no-pager -q | grep 'NVRM: Xid'" > "$out/journal-xid.cmd"
printf '%s\n' "journalctl -k -b --no-pager -q | wc -l" > "$out/journal-kernel-lines.cmd"
if command -v journalctl >/dev/null 2>&1; then
  kernel_log=$(mktemp)
  journal_err=$(mktemp)
  bounded "$query_timeout" journalctl -k -b --no-pager -q > "$kernel_log" 2> "$journal_err"
  journal_rc=$?
  { grep 'NVRM: Xid' "$kernel_log"; cat "$journal_err"; } > "$out/journal-xid.txt"
  echo "$journal_rc" > "$out/journal-xid.rc"
  { wc -l < "$kernel_log"; cat "$journal_err"; } > "$out/journal-kernel-lines.txt"
  echo "$journal_rc" > "$out/journal-kernel-lines.rc"
  rm -f "$kernel_log" "$journal_err"
else
  for name in journal-xid journal-kernel-lines; do
    echo "journalctl: not installed" > "$out/$name.txt"; echo 127 > "$out/$name.rc"
  done
fi
exit 0
