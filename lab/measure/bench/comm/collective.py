"""The six collectives of `lab bench collective`, each as nccl-tests defines it: size, busbw factor, buffers,
the torch.distributed call, and the exact result it must produce.

    op              size column (bytes)           count column        busbw / algbw
    all_reduce      the buffer                    its elements        2(n-1)/n
    all_gather      the output: n x the input     elements per rank   (n-1)/n
    reduce_scatter  the input: n x the output     elements per rank   (n-1)/n
    alltoall        the buffer: n blocks          elements per block  (n-1)/n
    broadcast       the buffer (root 0)           its elements        1
    sendrecv        the buffer                    its elements        1

algbw = size / time for every op (nccl-tests' src/*.cu GetBw; doc/PERFORMANCE.md derives the factors).
Where the count is per rank, -b/-e name the total and the count per rank is rounded down to whole 16-byte
blocks, as nccl-tests does; a size with no whole block per rank is skipped.

Out-of-place and in-place, as torch.distributed allows (nccl-tests runs each op both ways):
    all_reduce      out-of-place: copy the input into a second buffer, then all_reduce that (torch has no
                    out-of-place all-reduce; the copy is in the time). In-place: all_reduce(buffer).
    all_gather      out-of-place by nature: all_gather_into_tensor(output, input). In-place: the input is this
                    rank's slice of the output, as nccl-tests does.
    reduce_scatter  out-of-place by nature: reduce_scatter_tensor(output, input). In-place: the output is this
                    rank's slice of the input, as nccl-tests does.
    broadcast       out-of-place: the root copies its input into the output buffer, then broadcast(output)
                    (torch's broadcast works in place only). In-place: broadcast(buffer).
    alltoall        out-of-place: all_to_all_single(output, input). In-place: one buffer as both input and
                    output; nothing defines that result (blocks are overwritten while being sent), so it is
                    timed but not checked: #wrong is N/A, as nccl-tests prints it.
    sendrecv        out-of-place: batch_isend_irecv, sending to rank+1 and receiving from rank-1 (a ring, as
                    nccl-tests' sendrecv_perf). In-place: one buffer sent and received into: timed, #wrong N/A.

The backends: NCCL runs each op as its real collective. gloo (torch 2.6 to 2.14) has no reduce-scatter:
torch runs reduce_scatter_tensor there as an all_reduce of the whole input plus a copy of this rank's part
(torch.profiler shows one gloo:all_reduce; torch 2.6 also ignores MAX), so its time is an all-reduce's and a
reduce-scatter busbw made from it would be twice too high. On gloo the lab therefore runs reduce-scatter as
the ring algorithm NCCL's own ring uses, over gloo's send/recv: n-1 steps, each sending one block to rank+1
and reducing the block received from rank-1 into its own, so each rank sends (n-1)/n of the input, the
traffic the busbw factor assumes. The output and the JSON say so (GLOO_RING).

>>> [round(COLLECTIVES[name].factor(8), 3) for name in NAMES]
[1.75, 0.875, 0.875, 1.0, 0.875, 1.0]
>>> COLLECTIVES["all_gather"].counts(1024, 4, 2), COLLECTIVES["sendrecv"].counts(1024, 4, 2)
((128, 1024), (256, 1024))
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING

from lab.errors import LabError
from lab.measure.bench.comm.collective_data import (
    PATTERN,
    VALUES,
    Bodies,
    Setup,
    corrupt,
    count_wrong,
    exact_reductions,
    fill,
    filled,
    rank_values,
    reduction_input,
)

if TYPE_CHECKING:  # for the checker only: torch comes in as Setup.torch, so this module imports without it
    from torch import Tensor

ALIGN_BYTES = 16  # nccl-tests rounds a per-rank count down to whole 16-byte blocks


def _all_gather_call(tdist: ModuleType) -> Callable[..., object]:
    # torch 2.14 renamed all_gather_into_tensor to all_gather_single (the old name warns); 2.6 has the old only
    return getattr(tdist, "all_gather_single", None) or tdist.all_gather_into_tensor


def _reduce_scatter_call(tdist: ModuleType) -> Callable[..., object]:
    return getattr(tdist, "reduce_scatter_single", None) or tdist.reduce_scatter_tensor


# ----------------------------------------------------------------------------- the six
# Each check holds what its op needs (the input, and an output where the op is out-of-place) and a few chunks.


def _all_reduce_bodies(s: Setup) -> Bodies:
    send = s.zeros(s.count)
    recv = s.torch.empty_like(send)
    op = s.reduce_op()
    return (lambda: (recv.copy_(send), s.tdist.all_reduce(recv, op=op)), lambda: s.tdist.all_reduce(send, op=op))


def _all_reduce_check(s: Setup, out_of_place: bool, corrupt_rank: int | None) -> Tensor:
    x = filled(s, s.count, lambda i: reduction_input(s, i))
    corrupt(s, x, corrupt_rank)
    result = s.torch.empty_like(x).copy_(x) if out_of_place else x
    s.tdist.all_reduce(result, op=s.reduce_op())
    reduced = exact_reductions(s)
    return count_wrong(s, result, lambda i: reduced[i % PATTERN])


def _all_gather_bodies(s: Setup) -> Bodies:
    gather = _all_gather_call(s.tdist)
    send, recv = s.zeros(s.count), s.zeros(s.world_size * s.count)
    return lambda: gather(recv, send), lambda: gather(recv, s.mine(recv))


def _all_gather_check(s: Setup, out_of_place: bool, corrupt_rank: int | None) -> Tensor:
    out = s.unwritten(s.world_size * s.count)
    x = s.torch.empty(s.count, dtype=s.dtype, device=s.device) if out_of_place else s.mine(out)
    fill(s, x, lambda i: rank_values(s, i, s.rank))
    corrupt(s, x, corrupt_rank)
    _all_gather_call(s.tdist)(out, x)
    # block j holds rank j's data
    return count_wrong(s, out, lambda p: ((p % s.count + 31 * (p // s.count)) % VALUES).to(s.dtype))


GLOO_RING = (
    "gloo has no reduce-scatter (torch runs reduce_scatter_tensor there as an all-reduce), so the lab "
    "runs NCCL's ring algorithm over gloo's send/recv: n-1 steps of one block each; out-of-place first "
    "copies the input into a work buffer (in the time, as all_reduce's copy)"
)


def _ring_reduce_scatter(s: Setup, out: Tensor | None, x: Tensor, work: Tensor, received: Tensor) -> None:
    """Reduce-scatter of `x` (n blocks) into `out` (this rank's block) by the ring: at step k rank r sends
    block (r-k-1) mod n, the one it reduced at step k-1 (its own at k=0), to rank r+1, and reduces block
    (r-k-2) mod n received from rank r-1 into `work`; after n-1 steps its own block r holds every rank's.
    `work` is x itself in place (the result lands in x's block r), else a buffer x is copied into first."""
    if work is not x:
        work.copy_(x)
    n, r = s.world_size, s.rank

    def block(b: int) -> Tensor:
        return work[b * s.count : (b + 1) * s.count]

    for k in range(n - 1):
        _ring_exchange(s, block((r - k - 1) % n), received)
        mine = block((r - k - 2) % n)
        if s.op == "max":
            s.torch.maximum(mine, received, out=mine)
        else:
            mine.add_(received)
    if out is not None:
        out.copy_(block(r))


def _reduce_scatter_bodies(s: Setup) -> Bodies:
    send, recv = s.zeros(s.world_size * s.count), s.zeros(s.count)
    if s.tdist.get_backend() == "gloo":
        work, received = s.zeros(s.world_size * s.count), s.zeros(s.count)
        return (
            lambda: _ring_reduce_scatter(s, recv, send, work, received),
            lambda: _ring_reduce_scatter(s, None, send, send, received),
        )
    scatter, op = _reduce_scatter_call(s.tdist), s.reduce_op()
    return lambda: scatter(recv, send, op=op), lambda: scatter(s.mine(send), send, op=op)


def _reduce_scatter_check(s: Setup, out_of_place: bool, corrupt_rank: int | None) -> Tensor:
    # block by block another phase: a block sent to the wrong rank is counted
    x = filled(s, s.world_size * s.count, lambda p: reduction_input(s, p + p // s.count))
    corrupt(s, x, corrupt_rank)
    out = s.unwritten(s.count) if out_of_place else s.mine(x)
    if s.tdist.get_backend() == "gloo":
        work = s.zeros(s.world_size * s.count) if out_of_place else x
        _ring_reduce_scatter(s, out if out_of_place else None, x, work, s.zeros(s.count))
    else:
        _reduce_scatter_call(s.tdist)(out, x, op=s.reduce_op())
    reduced = exact_reductions(s)
    return count_wrong(s, out, lambda p: reduced[(p + p // s.count) % PATTERN], offset=s.rank * s.count)


ROOT = 0  # nccl-tests' default root (-r 0)


def _broadcast_bodies(s: Setup) -> Bodies:
    send, recv = s.zeros(s.count), s.zeros(s.count)

    def out_of_place() -> None:
        if s.rank == ROOT:
            recv.copy_(send)
        s.tdist.broadcast(recv, src=ROOT)

    return out_of_place, lambda: s.tdist.broadcast(send, src=ROOT)


def _broadcast_check(s: Setup, out_of_place: bool, corrupt_rank: int | None) -> Tensor:
    # every rank starts with its own data: only the root's may remain
    x = filled(s, s.count, lambda i: rank_values(s, i, s.rank))
    corrupt(s, x, corrupt_rank)
    out = s.unwritten(s.count) if out_of_place else x
    if out_of_place and s.rank == ROOT:
        out.copy_(x)
    s.tdist.broadcast(out, src=ROOT)
    return count_wrong(s, out, lambda i: rank_values(s, i, ROOT))


def _alltoall_bodies(s: Setup) -> Bodies:
    send, recv = s.zeros(s.world_size * s.count), s.zeros(s.world_size * s.count)
    return lambda: s.tdist.all_to_all_single(recv, send), lambda: s.tdist.all_to_all_single(send, send)


def _alltoall_check(s: Setup, out_of_place: bool, corrupt_rank: int | None) -> Tensor | None:
    if not out_of_place:
        return None  # one buffer as input and output: no defined result to check (nccl-tests: N/A)
    # block j of rank r's input goes to rank j; its data names both: (i + 31 r + 7 j) % 256
    x = filled(
        s, s.world_size * s.count, lambda p: ((p % s.count + 31 * s.rank + 7 * (p // s.count)) % VALUES).to(s.dtype)
    )
    corrupt(s, x, corrupt_rank)
    out = s.unwritten(s.world_size * s.count)
    s.tdist.all_to_all_single(out, x)
    # block j came from rank j
    return count_wrong(s, out, lambda p: ((p % s.count + 31 * (p // s.count) + 7 * s.rank) % VALUES).to(s.dtype))


def _ring_exchange(s: Setup, send: Tensor, recv: Tensor) -> None:
    """Send to rank+1 and receive from rank-1 as one group (separate NCCL send and recv calls could wait on
    each other); wait() makes the current stream wait on a GPU, and returns when done on gloo."""
    tdist, n = s.tdist, s.world_size
    for work in tdist.batch_isend_irecv(
        [tdist.P2POp(tdist.isend, send, (s.rank + 1) % n), tdist.P2POp(tdist.irecv, recv, (s.rank - 1) % n)]
    ):
        work.wait()


def _sendrecv_bodies(s: Setup) -> Bodies:
    send, recv = s.zeros(s.count), s.zeros(s.count)
    return lambda: _ring_exchange(s, send, recv), lambda: _ring_exchange(s, send, send)


def _sendrecv_check(s: Setup, out_of_place: bool, corrupt_rank: int | None) -> Tensor | None:
    if not out_of_place:
        return None  # sent from and received into one buffer: no defined result (nccl-tests: N/A)
    x = filled(s, s.count, lambda i: rank_values(s, i, s.rank))
    corrupt(s, x, corrupt_rank)
    out = s.unwritten(s.count)
    _ring_exchange(s, x, out)
    return count_wrong(s, out, lambda i: rank_values(s, i, (s.rank - 1) % s.world_size))


# ----------------------------------------------------------------------------- the table


@dataclass(frozen=True)
class Collective:
    name: str  # nccl-tests' name, without _perf
    title: str  # for headings and legends
    size_means: str  # what the size column counts
    factor_text: str  # busbw = algbw * this
    factor: Callable[[int], float]  # of the world size
    reduces: bool  # takes --op
    per_rank: bool  # the count column is per rank (per block) and the size n times it
    out_of_place: str  # what out-of-place means here, one line
    in_place: str  # what in-place means here, one line
    in_place_checked: bool  # False: in-place is timed, its #wrong N/A
    bodies: Callable[[Setup], Bodies]
    check: Callable[[Setup, bool, int | None], Tensor | None]  # elements wrong on this rank, or None: N/A
    root: int = -1
    on_gloo: str | None = None  # how the op runs on gloo, where that is not torch's call of the same name

    def counts(self, size: int, element_size: int, world_size: int) -> tuple[int, int]:
        """(count column, size column in bytes) for a requested size, as nccl-tests' GetCollByteCount."""
        count = size // element_size
        if not self.per_rank:
            return count, count * element_size
        align = max(1, ALIGN_BYTES // element_size)
        per_rank = count // world_size // align * align
        return per_rank, per_rank * world_size * element_size


def _ring(n: int) -> float:
    return (n - 1) / n


COLLECTIVES: dict[str, Collective] = {
    c.name: c
    for c in (
        Collective(
            "all_reduce",
            "all-reduce",
            size_means="bytes of the buffer",
            factor_text="2 (n-1) / n",
            factor=lambda n: 2 * (n - 1) / n,
            reduces=True,
            per_rank=False,
            out_of_place="copy + in-place all_reduce",
            in_place="all_reduce(buffer)",
            in_place_checked=True,
            bodies=_all_reduce_bodies,
            check=_all_reduce_check,
        ),
        Collective(
            "all_gather",
            "all-gather",
            size_means="bytes of the output: n x the input of a rank",
            factor_text="(n-1) / n",
            factor=_ring,
            reduces=False,
            per_rank=True,
            out_of_place="all_gather_into_tensor(output, input)",
            in_place="the input is this rank's slice of the output",
            in_place_checked=True,
            bodies=_all_gather_bodies,
            check=_all_gather_check,
        ),
        Collective(
            "reduce_scatter",
            "reduce-scatter",
            size_means="bytes of the input: n x the output of a rank",
            factor_text="(n-1) / n",
            factor=_ring,
            reduces=True,
            per_rank=True,
            out_of_place="reduce_scatter_tensor(output, input)",
            in_place="the output is this rank's slice of the input",
            in_place_checked=True,
            bodies=_reduce_scatter_bodies,
            check=_reduce_scatter_check,
            on_gloo=GLOO_RING,
        ),
        Collective(
            "broadcast",
            "broadcast",
            size_means="bytes of the buffer",
            factor_text="1",
            factor=lambda n: 1.0,
            reduces=False,
            per_rank=False,
            out_of_place="the root copies its input to the output, then broadcast(output)",
            in_place="broadcast(buffer)",
            in_place_checked=True,
            bodies=_broadcast_bodies,
            check=_broadcast_check,
            root=ROOT,
        ),
        Collective(
            "alltoall",
            "all-to-all",
            size_means="bytes of the buffer: n blocks, one per rank",
            factor_text="(n-1) / n",
            factor=_ring,
            reduces=False,
            per_rank=True,
            out_of_place="all_to_all_single(output, input)",
            in_place="one buffer as input and output (timed; no defined result)",
            in_place_checked=False,
            bodies=_alltoall_bodies,
            check=_alltoall_check,
        ),
        Collective(
            "sendrecv",
            "send/recv",
            size_means="bytes of the buffer",
            factor_text="1",
            factor=lambda n: 1.0,
            reduces=False,
            per_rank=False,
            out_of_place="batch_isend_irecv: send to rank+1, receive from rank-1",
            in_place="one buffer sent and received into (timed; no defined result)",
            in_place_checked=False,
            bodies=_sendrecv_bodies,
            check=_sendrecv_check,
        ),
    )
}
NAMES = tuple(COLLECTIVES)


def parse_names(text: str) -> list[str]:
    """OP as the command line gives it: one name, a comma list, or `all` (the six in table order).

    >>> parse_names("alltoall,all_gather"), len(parse_names("all"))
    (['alltoall', 'all_gather'], 6)
    >>> parse_names("allgather")
    Traceback (most recent call last):
    lab.errors.LabError: OP allgather: unknown collective; choose from all_reduce, all_gather, reduce_scatter, \
broadcast, alltoall, sendrecv, a comma list of them, or all
    """
    if text.strip() == "all":
        return list(NAMES)
    names = [name.strip() for name in text.split(",") if name.strip()]
    for name in names or [text]:
        if name not in COLLECTIVES:
            raise LabError(
                f"OP {name}: unknown collective; choose from {', '.join(NAMES)}, a comma list of them, or all"
            )
    if len(set(names)) != len(names):
        raise LabError(f"OP {text}: a collective is named twice")
    return names
