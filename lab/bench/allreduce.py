"""All-reduce bandwidth with nccl-tests' columns and definitions, over torch.distributed.

    lab bench allreduce -b 8 -e 256M -f 2 --nproc-per-node 8      # one node
    torchrun --nnodes 2 ... -m lab bench allreduce -b 1M -e 1G     # many nodes, no MPI

Definitions (nccl-tests, doc/PERFORMANCE.md):
    algbw = bytes / time                      GB/s with GB = 1e9 bytes
    busbw = algbw * 2 (n - 1) / n             what each link carries in a ring all-reduce

time is the mean over `-n` iterations after `-w` warm-ups, averaged over ranks.
Out-of-place: torch.distributed has no out-of-place all-reduce, so the lab copies the
input into a separate output buffer and reduces that (the copy is in the time);
in-place: the reduction runs on the input buffer itself.

>>> round(busbw(algbw(1e9, 0.1), 8), 6)    # 1 GB in 100 ms over 8 ranks
17.5
>>> parse_size("256M"), parse_size("8"), parse_size("1G")
(268435456, 8, 1073741824)
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass
from typing import Any

from lab.errors import LabError

SUFFIX = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3}  # nccl-tests' parsesize: binary multiples
# dtype name -> nccl-tests' type column
TYPE_NAMES = {"float32": "float", "float16": "half", "bfloat16": "bfloat16"}
OPS = ("sum", "avg", "max")
PATTERN = 4  # inputs cycle through 0..3, so sums stay small integers: exact in every dtype (see _inputs)

# Unidirectional bandwidth of common links, GB/s: what a busbw can at best approach.
LINKS: dict[str, tuple[float, str]] = {
    "nvlink4": (450.0, "NVLink 4 (H100/H200 SXM), per GPU per direction"),
    "nvlink3": (300.0, "NVLink 3 (A100 SXM), per GPU per direction"),
    "ndr-ib": (50.0, "InfiniBand NDR 400 Gb/s, per NIC"),
    "hdr-ib": (25.0, "InfiniBand HDR 200 Gb/s, per NIC"),
    "pcie5": (64.0, "PCIe Gen5 x16, per direction"),
    "pcie4": (32.0, "PCIe Gen4 x16, per direction"),
    "100gbe": (12.5, "100 Gb Ethernet"),
}


def parse_size(text: str) -> int:
    value = text.strip().upper()
    number, suffix = (value[:-1], value[-1]) if value and value[-1] in SUFFIX else (value, "")
    try:
        size = int(float(number) * SUFFIX[suffix])
    except ValueError:
        raise LabError(f"size {text!r}: expected bytes with an optional K, M or G suffix, e.g. 8, 64K, 256M") from None
    if size < 1:
        raise LabError(f"size {text!r}: must be at least 1 byte")
    return size


def size_steps(begin: int, end: int, factor: float) -> list[int]:
    """-b, -e, -f: begin, end and multiplication factor, as in nccl-tests."""
    if end < begin:
        raise LabError(f"-e {end} is below -b {begin}; the largest size must not be smaller than the smallest")
    if factor <= 1:
        raise LabError(f"-f {factor}: the step factor must be above 1")
    sizes, size = [], begin
    while size <= end:
        sizes.append(size)
        size = int(size * factor)
    return sizes


def algbw(nbytes: float, seconds: float) -> float:
    return nbytes / seconds / 1e9


def busbw(algbw_gbps: float, world_size: int) -> float:
    return algbw_gbps * 2 * (world_size - 1) / world_size


@dataclass
class Row:
    size: int
    count: int
    type: str
    redop: str
    root: int
    oop_time_us: float
    oop_algbw: float
    oop_busbw: float
    oop_wrong: int
    ip_time_us: float
    ip_algbw: float
    ip_busbw: float
    ip_wrong: int


def average_busbw(rows: list[Row]) -> float:
    """nccl-tests' '# Avg bus bandwidth': the mean over every size, out-of-place and in-place."""
    values = [r.oop_busbw for r in rows] + [r.ip_busbw for r in rows]
    return sum(values) / len(values) if values else 0.0


# ----------------------------------------------------------------------------- measuring


def _inputs(torch, count: int, rank: int, world_size: int, op: str, dtype, device):
    """Rank r holds x[i] = (i + r) % 4 (times n for avg, so the mean is an integer too).

    Every partial sum is an integer below 4n, exact in bfloat16 up to n = 64 and in
    float16 up to 512 ranks, so the check can demand exact equality."""
    scale = world_size if op == "avg" else 1
    i = torch.arange(count, device=device)
    x = ((i + rank) % PATTERN * scale).to(dtype)
    per_phase = torch.tensor([[(k + r) % PATTERN * scale for r in range(world_size)] for k in range(PATTERN)],
                             dtype=torch.float64, device=device)
    reduced = {"sum": per_phase.sum(1), "avg": per_phase.mean(1), "max": per_phase.amax(1)}[op]
    return x, reduced[i % PATTERN].to(dtype)


def measure(ctx, size: int, dtype_name: str, op: str, iters: int, warmup: int, corrupt_rank: int | None) -> Row | None:
    import torch
    import torch.distributed as tdist

    from lab import dist

    dtype = getattr(torch, dtype_name)
    count = size // torch.tensor([], dtype=dtype).element_size()
    if count == 0:
        return None
    reduce_op = {"sum": tdist.ReduceOp.SUM, "avg": tdist.ReduceOp.AVG, "max": tdist.ReduceOp.MAX}[op]
    nbytes = count * torch.tensor([], dtype=dtype).element_size()

    def all_reduce(t):
        if ctx.distributed:
            tdist.all_reduce(t, op=reduce_op)

    def timed(body) -> float:
        for _ in range(warmup):
            body()
        dist.barrier(ctx)
        if ctx.device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                body()
            end.record()
            end.synchronize()
            seconds = start.elapsed_time(end) / 1e3 / iters
        else:
            t0 = time.perf_counter()
            for _ in range(iters):
                body()  # gloo's all_reduce returns when the reduction is done
            seconds = (time.perf_counter() - t0) / iters
        total = torch.tensor([seconds], dtype=torch.float64, device=ctx.device)
        if ctx.distributed:
            tdist.all_reduce(total)
        return total.item() / ctx.world_size  # nccl-tests averages the time over ranks

    def wrong(out_of_place: bool) -> int:
        x, expected = _inputs(torch, count, ctx.global_rank, ctx.world_size, op, dtype, ctx.device)
        if corrupt_rank == ctx.global_rank:
            x[0] += 1  # test hook: one rank sends a wrong element
        result = torch.empty_like(x).copy_(x) if out_of_place else x
        all_reduce(result)
        bad = (result != expected).sum()
        if ctx.distributed:
            tdist.all_reduce(bad, op=tdist.ReduceOp.MAX)  # the worst rank's count, as nccl-tests reports
        return int(bad.item())

    send = torch.zeros(count, dtype=dtype, device=ctx.device)
    recv = torch.empty_like(send)
    oop = timed(lambda: (recv.copy_(send), all_reduce(recv)))
    ip = timed(lambda: all_reduce(send))
    row = Row(size=nbytes, count=count, type=TYPE_NAMES[dtype_name], redop=op, root=-1,
              oop_time_us=oop * 1e6, oop_algbw=algbw(nbytes, oop), oop_busbw=busbw(algbw(nbytes, oop), ctx.world_size),
              oop_wrong=wrong(True),
              ip_time_us=ip * 1e6, ip_algbw=algbw(nbytes, ip), ip_busbw=busbw(algbw(nbytes, ip), ctx.world_size),
              ip_wrong=wrong(False))
    return row


# ----------------------------------------------------------------------------- output

HEADER = (
    "#                                                              out-of-place                       in-place\n"
    "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong\n"
    "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)"
)


def format_row(r: Row) -> str:
    return (f"{r.size:12d}  {r.count:12d}  {r.type:>8}  {r.redop:>6}  {r.root:6d}  "
            f"{r.oop_time_us:7.2f} {r.oop_algbw:7.2f} {r.oop_busbw:7.2f} {r.oop_wrong:6d}  "
            f"{r.ip_time_us:7.2f} {r.ip_algbw:7.2f} {r.ip_busbw:7.2f} {r.ip_wrong:6d}")


def render(rows: list[Row], world_size: int, backend: str | None, link: str | None) -> str:
    avg = average_busbw(rows)
    lines = [f"# lab all-reduce: {world_size} rank(s), backend {backend or 'none'}; out-of-place = copy + in-place "
             f"all_reduce", HEADER, *map(format_row, rows)]
    wrong = sum(r.oop_wrong + r.ip_wrong for r in rows)
    lines.append(f"# Out of bounds values : {wrong} {'OK' if wrong == 0 else 'FAILED'}")
    lines.append(f"# Avg bus bandwidth    : {avg:g}")
    if link:
        peak, what = LINKS[link]
        best = max((max(r.oop_busbw, r.ip_busbw) for r in rows), default=0.0)
        lines.append(f"# Link {link} ({what}): {peak:g} GB/s; best busbw is {best / peak:.1%} of it, "
                     f"average {avg / peak:.1%}")
    return "\n".join(lines)


def guess_link(ctx) -> str | None:
    """The link an intra-node GPU all-reduce runs over, when the devices say it; None when unknown."""
    if ctx.device.type != "cuda" or ctx.local_world_size != ctx.world_size:
        return None
    import torch

    name = torch.cuda.get_device_name(ctx.device)
    if "H100" in name or "H200" in name:
        return "nvlink4" if "PCIe" not in name and "NVL" not in name else None
    return "nvlink3" if "A100-SXM" in name else None


# ----------------------------------------------------------------------------- the command


def run(args) -> int:
    """One rank of `lab bench allreduce`; returns the exit code (3 when --min-busbw is missed)."""
    from lab import dist, provenance, runs
    from lab.config import DistConfig

    if args.op not in OPS:
        raise LabError(f"--op {args.op}: expected one of {', '.join(OPS)}")
    sizes = size_steps(parse_size(args.minbytes), parse_size(args.maxbytes), args.stepfactor)
    if args.link and args.link not in LINKS:
        raise LabError(f"--link {args.link}: unknown; known links: {', '.join(LINKS)}")
    from lab import torchrun_env

    if torchrun_env.layout().world_size < 2:
        # One rank reduces nothing: the "collective" is a no-op, its time ~0 and its algbw meaningless
        # (thousands of GB/s on a CPU; a division by a zero event time on CUDA).
        raise LabError("lab bench allreduce: 1 rank: an all-reduce over one process moves no data, so there is "
                       "nothing to measure; use --nproc-per-node 2 or more, or torchrun over several nodes")
    with dist.initialized(DistConfig()) as ctx:
        if args.op == "avg" and ctx.backend == "gloo":
            raise LabError("--op avg: the gloo backend has no AVG reduction; use --op sum (or NCCL on GPUs)")
        corrupt = os.environ.get("LAB_ALLREDUCE_CORRUPT_RANK")  # test hook: make #wrong non-zero on purpose
        rows = [row for size in sizes
                if (row := measure(ctx, size, args.dtype, args.op, args.iters, args.warmup_iters,
                                   int(corrupt) if corrupt else None)) is not None]
        link = args.link or guess_link(ctx)
        avg = average_busbw(rows)
        ranks = dist.all_gather_object(ctx, provenance.describe(ctx))
        gate_missed = args.min_busbw is not None and avg < args.min_busbw
        if ctx.is_primary:
            print(render(rows, ctx.world_size, ctx.backend, link), flush=True)
            if args.json:
                runs.write_json(args.json, result(ctx, ranks, rows, args, link, avg, gate_missed))
            if args.pushgateway:
                from lab import metrics

                metrics.push_allreduce(args.pushgateway, runs.new_run_id("allreduce"), [asdict(r) for r in rows],
                                       args.dtype, args.op)
            if gate_missed:
                print(f"# FAILED: average bus bandwidth {avg:g} GB/s is below --min-busbw {args.min_busbw:g}",
                      flush=True)
        # Under `--nproc-per-node` the parent judges the gate from the JSON (torchrun would report a worker's 3
        # as its own failure), so the workers it starts (--gate-in-parent) exit 0.
        return 3 if gate_missed and not args.gate_in_parent else 0


def result(ctx, ranks: list[dict], rows: list[Row], args, link: str | None, avg: float,
           gate_missed: bool) -> dict[str, Any]:
    from lab import provenance

    return {
        "benchmark": "allreduce", "world_size": ctx.world_size, "backend": ctx.backend, "dtype": args.dtype,
        "op": args.op, "iters": args.iters, "warmup_iters": args.warmup_iters,
        "definitions": {"algbw": "bytes / time, GB/s (1e9)", "busbw": "algbw * 2 (n-1) / n"},
        "rows": [asdict(r) for r in rows], "avg_busbw": avg, "link": link,
        "link_gbps": LINKS[link][0] if link else None, "min_busbw": args.min_busbw, "gate_missed": gate_missed,
        "versions": provenance.versions(), "hosts": sorted({r["host"] for r in ranks}),
        "devices": [r["device_name"] for r in ranks], "environment": provenance.recorded_env(),
    }
