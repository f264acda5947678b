"""Which tool for this model on these GPUs: the scaling lecture's decision tree, walked with numbers.

    lab choose --params 7B --gpus-per-node 8 --device h100
    lab choose --params 70B --gpus-per-node 8 --nodes 2 --device h100 --interconnect ib-ndr --json choice.json
    lab choose --params 1.5T --gpus-per-node 8 --nodes 64 --gpu-memory 141 --seq-len 4096 --hidden 8192 --layers 80

Memory per GPU is lab.measure.sizing.memory's estimate (ZeRO convention: 16 bytes per parameter for mixed-precision
Adam), plus activations when given, against the GPU's memory less --headroom. In order:
1. the whole training state fits on each GPU -> DDP;
2. ZeRO-1 fits with room (optimizer state sharded) -> ZeRO-1; else ZeRO-2 fits (gradients too) -> ZeRO-2;
3. full sharding fits -> FSDP full shard; across nodes on a slow link, hybrid shard when it fits;
4. nothing fits -> offload to CPU/NVMe, or the smallest GPU count at which full sharding fits.
Horovod gets one line, never the choice: it fits where DDP does, and its status is said (what is printed and
written of a choice: lab.measure.sizing.choose_output).

>>> choice = decide(Request(params=parse_params("7B"), gpus_per_node=8))
>>> [d.answer.split(" per GPU")[0] for d in choice.decisions]
['no: 112 GB', 'ZeRO-1 yes: 38.5 GB']
>>> choice.strategy, choice.lab_train
('zero-1', 'lab train --config ddp --nproc-per-node 8 --set dist.strategy=deepspeed --set dist.zero_stage=1')
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from lab.errors import LabError
from lab.measure.sizing.memory import DEVICES_GB, activation_bytes, estimate
from lab.run.config import strategies

# Inter-node bandwidth per GPU, GB/s each way, with one NIC per GPU as on NVIDIA's DGX "rails" (GPUs that share a
# NIC share its rate: divide). DGX H100: 8x ConnectX-7 at 400 Gb/s NDR per node; DGX A100: 8x ConnectX-6 at
# 200 Gb/s HDR; GB200 NVL72 spec sheet: NVLink 5 at 1.8 TB/s per GPU, both directions together.
INTERCONNECT_GBPS = {
    "ib-ndr": 400 / 8,
    "ib-hdr": 200 / 8,
    "roce-200": 200 / 8,
    "ethernet-100": 100 / 8,
    "ethernet-25": 25 / 8,
    "nvlink-nvl72": 900.0,
}
# Full sharding all-gathers the 16-bit parameters in forward and again in backward and reduce-scatters the
# gradients: 6 bytes per parameter per step, 1.5x DDP's all-reduce (ZeRO paper, section 7). Compute is 6 FLOP per
# parameter per token, so that traffic hides behind compute only while link GB/s >= achieved FLOP/s / tokens per GPU
# per step: ~400 TFLOP/s (40% of an H100's 989 dense bf16) / 4096 tokens = ~98 GB/s. Every NIC above is slower;
# NVLink (450 GB/s each way on an H100) is not. Below it, across nodes, keep the parameter traffic on NVLink.
SLOW_LINK_GBPS = 100.0
# Left free of the estimate: the CUDA context (~0.5 GB per process), the caching allocator's fragmentation, NCCL's
# buffers and cuBLAS workspaces, none of which the estimate counts (lab memory's table says "keep about 10% free").
HEADROOM = 0.1
# ZeRO-1 keeps whole gradients, so gradient accumulation communicates once per step where ZeRO-2 reduce-scatters every
# micro-batch: ZeRO-1 when it fits with room. Without --seq-len/--hidden/--layers the activations are unknown and
# "room" is this part of usable memory left after ZeRO-1; with them, they are counted, and fitting is room enough.
ZERO1_ROOM = 0.1
TP_PP_LEFT = 0.1  # note tensor/pipeline parallelism when one layer, or the sharded weights, leave less than this
_PARAMS = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(e[+-]?\d+)? ?([kmbt]?)", re.IGNORECASE)
_SCALE = {"": 1.0, "k": 1e3, "m": 1e6, "b": 1e9, "t": 1e12}


def parse_params(text: str) -> float:
    """--params: a number with an exponent or with one of K, M, B, T (one space allowed before it); argparse's type.

    >>> [parse_params(t) / 1e9 for t in ("7B", "70e9", "1.5T", "350M", "125e6", "7 B")]
    [7.0, 70.0, 1500.0, 0.35, 0.125, 7.0]
    """
    match = _PARAMS.fullmatch(text.strip())
    if not match or (match[2] and match[3]):
        raise LabError(f"--params {text!r} is not a parameter count; use e.g. 7B, 70e9, 1.5T, 350M or 125e6")
    value = float(match[1] + (match[2] or "")) * _SCALE[match[3].lower()]
    if not 1 <= value < math.inf:
        raise LabError(f"--params {text!r}: the parameter count must be at least 1 (and finite), e.g. 7B")
    return value


def _float_in(ok: Callable[[float], bool], says: str) -> Callable[[str], float]:
    """An argparse type: a finite float that `ok` accepts; argparse's one line names the option."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and ok(value)):
            raise argparse.ArgumentTypeError(says.format(text))
        return value

    parse.__name__ = "number"
    return parse


GPU_MEMORY_GB = _float_in(lambda v: v > 0, "{!r} GB; use a positive size, e.g. 80")
FRACTION = _float_in(lambda v: 0 <= v < 1, "{!r}; use a fraction from 0 up to (not) 1, e.g. 0.1")


@dataclass(frozen=True)
class Request:
    params: float
    gpus_per_node: int = 8
    nodes: int = 1
    device_bytes: float = DEVICES_GB["h100"] * 1e9
    headroom: float = HEADROOM
    link_gbps: float = INTERCONNECT_GBPS["ib-ndr"]
    optimizer: str = "adam"
    precision: str = "bf16"
    activations_bytes: float = 0.0  # all layers', per GPU
    layer_activations_bytes: float = 0.0

    @property
    def gpus(self) -> int:
        return self.gpus_per_node * self.nodes

    @property
    def usable_bytes(self) -> float:
        return self.device_bytes * (1 - self.headroom)


@dataclass
class Decision:
    question: str
    answer: str
    numbers: dict[str, Any]


@dataclass
class Choice:
    strategy: str
    lab_train: str | None
    decisions: list[Decision]
    notes: list[str] = field(default_factory=list)


def lab_sets(answer: str) -> list[str]:
    """The --set lines of the first lab strategy that trains `answer` (lab.run.config.strategies' rows say which); the
    lab has no key for hybrid sharding (its fsdp full-shards: a note says so) or offload.

    >>> lab_sets("zero-2"), lab_sets("ddp")
    (['dist.strategy=deepspeed', 'dist.zero_stage=2'], [])
    """
    rows = strategies.training(answer)
    if not rows:
        return []
    first = rows[0]
    return ([] if first.name == strategies.DEFAULT else [f"dist.strategy={first.name}"]) + list(first.chooses[answer])


def lab_train(strategy: str, gpus_per_node: int, nodes: int) -> str:
    sets = "".join(f" --set {line}" for line in lab_sets(strategy))
    if nodes == 1:
        return f"lab train --config ddp --nproc-per-node {gpus_per_node}{sets}"
    return (
        f"lab launch --nnodes {nodes} --nproc-per-node {gpus_per_node} --rdzv-endpoint HEAD:29400 --rdzv-id RUN "
        f"-- -m lab train --config ddp{sets}"
    )


def _gb(value: float) -> str:
    return f"{value / 1e9:.2f}".rstrip("0").rstrip(".") + " GB"


def _fit(row: dict[str, Any], usable: float) -> str:
    yes = row["total_bytes"] <= usable
    return f"{'yes' if yes else 'no'}: {_gb(row['total_bytes'])} per GPU {'<=' if yes else '>'} {_gb(usable)} usable"


def decide(req: Request) -> Choice:
    n, usable = req.gpus, req.usable_bytes
    rows = {
        r["strategy"].split(" (")[0]: r
        for r in estimate(req.params, n, req.optimizer, req.precision, "zero", req.gpus_per_node, req.activations_bytes)
    }
    # fp32 training has an "FSDP full shard" row apart from ZeRO-3 (DeepSpeed's fp32 master copy): FSDP's is the one
    full = rows.get("ZeRO-3 / FSDP full shard") or rows["FSDP full shard"]
    ddp, zero1, zero2 = rows["DDP"], rows["ZeRO-1"], rows["ZeRO-2"]
    fits = lambda row: row["total_bytes"] <= usable  # noqa: E731
    numbers = lambda row, **more: {"usable_bytes": usable, **row, **more}  # noqa: E731
    parts = (
        f" (parameters {_gb(ddp['parameters_bytes'])} + gradients {_gb(ddp['gradients_bytes'])} + optimizer "
        f"state {_gb(ddp['optimizer_states_bytes'])}"
        + (f" + activations {_gb(req.activations_bytes)})" if req.activations_bytes else ")")
    )
    decisions = [
        Decision("DDP: does the whole training state fit on each GPU?", _fit(ddp, usable) + parts, numbers(ddp))
    ]
    notes = _tp_pp_note(req, full)
    if fits(ddp):
        return _choice("ddp", req, decisions, notes)
    left = usable - zero1["total_bytes"]
    room = fits(zero1) and (req.activations_bytes > 0 or left >= ZERO1_ROOM * usable)
    said = (
        ""
        if req.activations_bytes or not fits(zero1)
        else f", leaving {_gb(left)} for activations ({'>=' if room else '<'} {ZERO1_ROOM:.0%})"
    )
    decisions.append(
        Decision(
            f"ZeRO-1/2: does it fit with the optimizer state (ZeRO-1), or the gradients too (ZeRO-2), sharded over {n} "
            "GPUs?",
            f"ZeRO-1 {_fit(zero1, usable)}{said}; ZeRO-2 {_gb(zero2['total_bytes'])}, at DDP's communication "
            "volume (reduce-scatter + all-gather = all-reduce); FSDP's equivalent is SHARD_GRAD_OP",
            numbers(zero1, zero2_total_bytes=zero2["total_bytes"], zero1_room=room),
        )
    )
    if room or fits(zero2):
        return _choice("zero-1" if room else "zero-2", req, decisions, notes)
    decisions.append(
        Decision(
            f"full shard: does it fit with the parameters sharded too over {n} GPUs (ZeRO-3)?",
            _fit(full, usable),
            numbers(full),
        )
    )
    if not fits(full):
        return _offload(req, full, decisions, notes)
    if req.nodes == 1:
        return _choice("fsdp-full", req, decisions, notes)
    return _across_nodes(req, full, rows.get("FSDP hybrid shard", ddp), decisions, notes)  # 1 GPU a node: as DDP


def _across_nodes(
    req: Request, full: dict[str, Any], hybrid: dict[str, Any], decisions: list[Decision], notes: list[str]
) -> Choice:
    """Full shard fits over all GPUs; on a slow inter-node link, keep sharding inside a node when that fits."""
    n, usable, link = req.gpus, req.usable_bytes, req.link_gbps * 1e9
    p, g = full["parameters_bytes"] * n, full["gradients_bytes"] * n  # bytes of the whole model
    full_s = (2 * p + g) * (n - 1) / n / link  # 2 all-gathers + a reduce-scatter, per GPU per step
    hybrid_s = 2 * g / req.gpus_per_node * (req.nodes - 1) / req.nodes / link  # all-reduce of a node's shard
    slow, fits = req.link_gbps < SLOW_LINK_GBPS, hybrid["total_bytes"] <= usable
    decisions.append(
        Decision(
            "across nodes: is the link slow next to NVLink, and does hybrid shard fit?",
            f"link {req.link_gbps:g} GB/s per GPU {'<' if slow else '>='} {SLOW_LINK_GBPS:g} GB/s: "
            f"{'slow' if slow else 'fast'}; its traffic per step takes >= {full_s:.3g} s under full shard, "
            f"{hybrid_s:.3g} s under hybrid; hybrid (node of {req.gpus_per_node}) {_fit(hybrid, usable)}",
            {
                "usable_bytes": usable,
                **hybrid,
                "link_gbps": req.link_gbps,
                "slow_link_gbps": SLOW_LINK_GBPS,
                "full_shard_link_seconds": full_s,
                "hybrid_link_seconds": hybrid_s,
            },
        )
    )
    if slow and fits:
        notes.append(
            "the lab's dist.strategy=fsdp full-shards: hybrid sharding needs a 2-D device mesh "
            "(nodes x GPUs per node), not a lab key yet"
        )
        return _choice("fsdp-hybrid", req, decisions, notes)
    return _choice("fsdp-full", req, decisions, notes)


def _offload(req: Request, full: dict[str, Any], decisions: list[Decision], notes: list[str]) -> Choice:
    usable = req.usable_bytes
    leave, room = full["total_bytes"] - usable, usable - req.activations_bytes
    numbers = {"usable_bytes": usable, "leave_bytes_per_gpu": leave, "full_shard": full}
    if room <= 0:  # activations do not shard over data-parallel ranks, nor leave for the CPU here
        decisions.append(
            Decision(
                "offload: how much has to leave each GPU?",
                f"{_gb(leave)} per GPU, but activations alone ({_gb(req.activations_bytes)}) exceed "
                f"{_gb(usable)}: neither offloading the training state nor more GPUs makes room",
                {**numbers, "smallest_gpus": None},
            )
        )
        notes.append("no lab train line fits: recompute activations or split layers (tensor/pipeline parallelism)")
        return Choice("offload", None, decisions, notes)
    total = (full["total_bytes"] - req.activations_bytes) * req.gpus  # the training state, all GPUs together
    gpus = max(1, math.ceil(total / room))
    if gpus > 1 and total / (gpus - 1) <= room:  # float rounding of an exact fit
        gpus -= 1
    nodes = math.ceil(gpus / req.gpus_per_node)
    what = (
        "the optimizer state (with its fp32 master weights) to CPU is enough"
        if full["optimizer_states_bytes"] >= leave
        else "the optimizer state and the parameters (CPU, then NVMe: ZeRO-Infinity)"
    )
    decisions.append(
        Decision(
            "offload: how much has to leave each GPU?",
            f"{_gb(leave)} per GPU ({_gb(leave * req.gpus)} in all): {what}; or more GPUs: full "
            f"sharding fits at {gpus} GPUs ({nodes} nodes of {req.gpus_per_node})",
            {**numbers, "smallest_gpus": gpus},
        )
    )
    notes.append("offload has no lab key: the line is the other way out, full sharding on more GPUs")
    return Choice("offload", lab_train("fsdp-full", req.gpus_per_node, nodes), decisions, notes)


def _tp_pp_note(req: Request, full: dict[str, Any]) -> list[str]:
    room = req.device_bytes * (1 - TP_PP_LEFT)
    why = [
        f"{what} ({_gb(value)}) leave under {TP_PP_LEFT:.0%} of {_gb(req.device_bytes)}"
        for what, value in (
            ("one layer's activations", req.layer_activations_bytes),
            ("the weights per GPU under full sharding", full["parameters_bytes"]),
        )
        if value > room
    ]
    if req.activations_bytes > req.usable_bytes:
        why.append(f"all layers' activations ({_gb(req.activations_bytes)}) exceed {_gb(req.usable_bytes)} usable")
    return [f"tensor/pipeline parallelism (beyond the lab): {'; '.join(why)}"] if why else []


def _choice(strategy: str, req: Request, decisions: list[Decision], notes: list[str]) -> Choice:
    others = [row.name for row in strategies.training(strategy)[1:]]
    if others:  # the line names the table's first; a strategy registered after it trains this choice too
        notes.append(f"the lab's dist.strategy={' or '.join(others)} trains this choice too")
    return Choice(strategy, lab_train(strategy, req.gpus_per_node, req.nodes), decisions, notes)


def request(args: argparse.Namespace) -> tuple[Request, str]:
    """The Request the arguments describe, and a line that says what it is (and what was assumed)."""
    if args.device and args.gpu_memory:
        raise LabError("--device and --gpu-memory: give one of them, not both")
    given = [args.seq_len, args.hidden, args.layers]
    if any(v is not None for v in (*given, args.heads)) and None in given:
        raise LabError(
            "--seq-len, --hidden, --layers: give all three for the activation term (--heads and "
            "--micro-batch have defaults), or none"
        )
    layer = 0.0
    if args.seq_len:
        heads = args.heads or max(1, args.hidden // 128)
        layer = activation_bytes(args.seq_len, args.micro_batch, args.hidden, heads, 1)
    device = args.device or ("GPU" if args.gpu_memory else "h100")
    gb = args.gpu_memory or DEVICES_GB[device]
    req = Request(
        args.params,
        args.gpus_per_node,
        args.nodes,
        gb * 1e9,
        args.headroom,
        INTERCONNECT_GBPS[args.interconnect],
        args.optimizer,
        args.precision,
        layer * (args.layers or 0),
        layer,
    )
    said = "" if args.device or args.gpu_memory else " (no --device or --gpu-memory: assuming h100)"
    return req, (
        f"{args.params / 1e9:.4g}B parameters on {req.gpus} GPUs ({req.nodes} x {req.gpus_per_node}), {device} "
        f"{gb:g} GB{said}, {_gb(req.usable_bytes)} usable after {req.headroom:.0%} headroom; "
        f"{req.optimizer}, {req.precision}"
    )
