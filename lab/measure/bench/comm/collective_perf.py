"""nccl-tests' table over torch.distributed: timing, columns, the check and the JSON that `lab bench allreduce` and
`lab bench collective` share (what to run: lab.measure.bench.comm.collective_plan; each op's size, factor, buffers
and result: lab.measure.bench.comm.collective).

    lab bench collective all_gather -b 8 -e 256M -f 2 --nproc-per-node 8     # one op, one node
    lab bench collective all -b 1K -e 4M --nproc-per-node 2                   # the six, one torchrun job
    torchrun --nnodes 2 ... -m lab bench collective alltoall -b 1M -e 1G      # many nodes, no MPI

Definitions (nccl-tests, doc/PERFORMANCE.md):
    algbw = size / time        GB/s with GB = 1e9 bytes; the size as each op defines it
    busbw = algbw * factor     2(n-1)/n all_reduce; (n-1)/n all_gather, reduce_scatter, alltoall; 1 broadcast, sendrecv

time is the mean over `-n` iterations after `-w` warm-ups, averaged over ranks: on GPUs between two CUDA
events around the loop, with no host synchronisation inside it. #wrong counts the elements that differ from
the exact result (the worst rank's count), N/A where the op has no defined in-place result. The average
busbw, the gate's figure, is nccl-tests' '# Avg bus bandwidth': every size, out-of-place and in-place.

With several ops, `--json PATH` writes one file per op, PATH with `-OP` before its suffix; each holds the
same document as one op's PATH would (allreduce's keys plus "collective").
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from lab.measure.bench.comm.collective import COLLECTIVES, Collective
from lab.measure.bench.comm.collective_data import Setup
from lab.measure.bench.comm.collective_plan import LINKS, corrupt_rank, json_paths, one_rank, plan

if TYPE_CHECKING:  # imported where used: the parent of --nproc-per-node runs without torch
    from lab.run.cluster.dist import DistContext

# dtype name -> nccl-tests' type column
TYPE_NAMES = {"float32": "float", "float16": "half", "bfloat16": "bfloat16"}


def algbw(nbytes: float, seconds: float) -> float:
    return nbytes / seconds / 1e9


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
    ip_wrong: int | None  # None: not checked (nccl-tests prints N/A; its JSON has null)


def average_busbw(rows: list[Row]) -> float:
    """nccl-tests' '# Avg bus bandwidth': the mean over every size, out-of-place and in-place."""
    values = [r.oop_busbw for r in rows] + [r.ip_busbw for r in rows]
    return sum(values) / len(values) if values else 0.0


# ----------------------------------------------------------------------------- measuring


def measure(
    ctx: DistContext,
    coll: Collective,
    size: int,
    dtype_name: str,
    op: str,
    iters: int,
    warmup: int,
    corrupt_rank: int | None,
) -> Row | None:
    """One row: `coll` at `size` out-of-place then in-place, timed, then checked. None when `size` holds no
    element (or, for ops per rank, no whole 16-byte block per rank)."""
    import torch
    import torch.distributed as tdist

    from lab.run.cluster import dist

    dtype = getattr(torch, dtype_name)
    count, nbytes = coll.counts(size, torch.tensor([], dtype=dtype).element_size(), ctx.world_size)
    if count == 0:
        return None
    setup = Setup(torch, ctx.global_rank, ctx.world_size, ctx.device, dtype, count, op if coll.reduces else "none")

    def timed(body: Callable[[], object]) -> float:
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
                body()  # gloo's collectives return when they are done
            seconds = (time.perf_counter() - t0) / iters
        total = torch.tensor([seconds], dtype=torch.float64, device=ctx.device)
        tdist.all_reduce(total)
        return total.item() / ctx.world_size  # nccl-tests averages the time over ranks

    def wrong(out_of_place: bool) -> int | None:
        bad = coll.check(setup, out_of_place, corrupt_rank)
        if bad is None:  # the op's property, the same on every rank
            return None
        tdist.all_reduce(bad, op=tdist.ReduceOp.MAX)  # the worst rank's count, as nccl-tests reports
        return int(bad.item())

    out_of_place, in_place = coll.bodies(setup)
    oop, ip = timed(out_of_place), timed(in_place)
    del out_of_place, in_place  # their buffers go before the checks make their own (at 8 GiB, 16 GiB on each GPU)
    factor = coll.factor(ctx.world_size)
    oop_wrong = wrong(True)
    assert oop_wrong is not None  # only in-place results can go unchecked: every collective checks out-of-place
    return Row(
        size=nbytes,
        count=count,
        type=TYPE_NAMES[dtype_name],
        redop=setup.op,
        root=coll.root,
        oop_time_us=oop * 1e6,
        oop_algbw=algbw(nbytes, oop),
        oop_busbw=algbw(nbytes, oop) * factor,
        oop_wrong=oop_wrong,
        ip_time_us=ip * 1e6,
        ip_algbw=algbw(nbytes, ip),
        ip_busbw=algbw(nbytes, ip) * factor,
        ip_wrong=wrong(False),
    )


# ----------------------------------------------------------------------------- output

HEADER = (
    "#                                                              out-of-place                       in-place\n"
    "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong\n"  # noqa: E501 - nccl-tests' own header
    "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)"
)


def format_row(r: Row) -> str:
    ip_wrong = f"{r.ip_wrong:6d}" if r.ip_wrong is not None else "   N/A"
    return (
        f"{r.size:12d}  {r.count:12d}  {r.type:>8}  {r.redop:>6}  {r.root:6d}  "
        f"{r.oop_time_us:7.2f} {r.oop_algbw:7.2f} {r.oop_busbw:7.2f} {r.oop_wrong:6d}  "
        f"{r.ip_time_us:7.2f} {r.ip_algbw:7.2f} {r.ip_busbw:7.2f} {ip_wrong}"
    )


def render(coll: Collective, rows: list[Row], world_size: int, backend: str | None, link: str | None) -> str:
    avg = average_busbw(rows)
    lines = [
        f"# lab {coll.title}: {world_size} rank(s), backend {backend or 'none'}; out-of-place = "
        f"{coll.out_of_place}; in-place = {coll.in_place}"
    ]
    if backend == "gloo" and coll.on_gloo:
        lines.append(f"# on gloo: {coll.on_gloo}")
    lines += [HEADER, *map(format_row, rows)]
    wrong = sum(r.oop_wrong + (r.ip_wrong or 0) for r in rows)
    lines.append(f"# Out of bounds values : {wrong} {'OK' if wrong == 0 else 'FAILED'}")
    lines.append(f"# Avg bus bandwidth    : {avg:g}")
    if link:
        peak, what = LINKS[link]
        best = max((max(r.oop_busbw, r.ip_busbw) for r in rows), default=0.0)
        lines.append(
            f"# Link {link} ({what}): {peak:g} GB/s; best busbw is {link_share(best, peak)}, average {avg / peak:.1%}"
        )
    return "\n".join(lines)


def link_share(busbw: float, link_gbps: float) -> str:
    """busbw as a share of the link's stated bandwidth, and why when it is over 100%.

    busbw counts the traffic a ring would carry (2(n-1)/n of the data for an all-reduce). With NVLS the NVSwitch
    reduces in the switch, each GPU sends its data once and receives the sum once, so busbw can pass the link:
    that is work the switch took off the GPUs, not a faster link.

    >>> link_share(360.0, LINKS["nvlink4"][0])
    '80.0% of it'
    >>> link_share(480.0, LINKS["nvlink4"][0])
    '106.7% of it (over 100%: in-switch reduction (NVLS) carries less than the ring busbw counts)'
    """
    share = busbw / link_gbps
    note = " (over 100%: in-switch reduction (NVLS) carries less than the ring busbw counts)" if share > 1 else ""
    return f"{share:.1%} of it{note}"


def guess_link(ctx: DistContext) -> str | None:
    """The link an intra-node GPU collective runs over, when the devices say it; None when unknown."""
    if ctx.device.type != "cuda" or ctx.local_world_size != ctx.world_size:
        return None
    import torch

    name = torch.cuda.get_device_name(ctx.device)
    if "H100" in name or "H200" in name:
        return "nvlink4" if "PCIe" not in name and "NVL" not in name else None
    return "nvlink3" if "A100-SXM" in name else None


# ----------------------------------------------------------------------------- the commands


def run(args: argparse.Namespace, benchmark: str) -> int:
    """One rank of `lab bench allreduce` (benchmark "allreduce") or `lab bench collective`; returns the exit
    code (3 when an op's average busbw is below --min-busbw)."""
    from lab.run.cluster import torchrun_env

    request = plan(args, benchmark)  # before torch is imported: bad input is refused at once
    if torchrun_env.layout().world_size < 2:
        raise one_rank(benchmark)
    from lab.run.cluster import dist, provenance
    from lab.run.config import DistConfig
    from lab.run.training import runs

    with dist.initialized(DistConfig()) as ctx:
        tables = []
        for name in request.names:
            coll, corrupt = COLLECTIVES[name], corrupt_rank(benchmark, name)
            rows = [
                row
                for size in request.sizes
                if (row := measure(ctx, coll, size, args.dtype, request.op, args.iters, args.warmup_iters, corrupt))
                is not None
            ]
            tables.append((coll, rows, average_busbw(rows)))
        link = args.link or guess_link(ctx)
        ranks = dist.all_gather_object(ctx, provenance.describe(ctx))
        missed = [coll.name for coll, _, avg in tables if args.min_busbw is not None and avg < args.min_busbw]
        if ctx.is_primary:
            for coll, rows, avg in tables:
                print(render(coll, rows, ctx.world_size, ctx.backend, link), flush=True)
                if coll.name in missed:
                    of = "" if benchmark == "allreduce" else f" of {coll.name}"
                    print(
                        f"# FAILED: average bus bandwidth{of} {avg:g} GB/s is below --min-busbw {args.min_busbw:g}",
                        flush=True,
                    )
                if len(tables) > 1:
                    print(flush=True)
            if len(tables) > 1:
                print(
                    "# Avg bus bandwidth (GB/s) by collective: "
                    + ", ".join(f"{coll.name} {avg:.3g}" for coll, _, avg in tables),
                    flush=True,
                )
            if args.json:
                paths = json_paths(args.json, request.names)
                for coll, rows, avg in tables:
                    runs.write_json(
                        paths[coll.name],
                        result(ctx, ranks, coll, rows, args, benchmark, request.op, link, avg, coll.name in missed),
                    )
            if getattr(args, "pushgateway", None):  # lab bench allreduce only: its series is all-reduce's
                from lab.run.observability import metrics

                metrics.push_allreduce(
                    args.pushgateway,
                    runs.new_run_id("allreduce"),
                    [asdict(r) for r in tables[0][1]],
                    args.dtype,
                    request.op,
                )
        # Under `--nproc-per-node` the parent judges the gate from the JSON (torchrun would report a worker's 3
        # as its own failure), so the workers it starts (--gate-in-parent) exit 0.
        return 3 if missed and not args.gate_in_parent else 0


def result(
    ctx: DistContext,
    ranks: list[dict[str, Any]],
    coll: Collective,
    rows: list[Row],
    args: argparse.Namespace,
    benchmark: str,
    op: str,
    link: str | None,
    avg: float,
    gate_missed: bool,
) -> dict[str, Any]:
    """One op's JSON: allreduce's document; `lab bench collective` adds "collective" and says what size,
    count, out-of-place and in-place mean for that op."""
    from lab.run.cluster import provenance

    definitions = {"algbw": "bytes / time, GB/s (1e9)", "busbw": f"algbw * {coll.factor_text}"}
    if benchmark == "collective":
        definitions = {
            "algbw": "size / time, GB/s (1e9)",
            "busbw": f"algbw * {coll.factor_text}",
            "size": coll.size_means,
            "count": "elements per rank" if coll.per_rank else "elements",
            "out_of_place": coll.out_of_place,
            "in_place": coll.in_place,
            **({"on_gloo": coll.on_gloo} if ctx.backend == "gloo" and coll.on_gloo else {}),
        }
    return {
        "benchmark": benchmark,
        **({"collective": coll.name} if benchmark == "collective" else {}),
        "world_size": ctx.world_size,
        "backend": ctx.backend,
        "dtype": args.dtype,
        "op": op if coll.reduces else "none",
        "iters": args.iters,
        "warmup_iters": args.warmup_iters,
        "definitions": definitions,
        "rows": [asdict(r) for r in rows],
        "avg_busbw": avg,
        "link": link,
        "link_gbps": LINKS[link][0] if link else None,
        "min_busbw": args.min_busbw,
        "gate_missed": gate_missed,
        "versions": provenance.versions(),
        "hosts": sorted({r["host"] for r in ranks}),
        "devices": [r["device_name"] for r in ranks],
        "environment": provenance.recorded_env(),
    }
