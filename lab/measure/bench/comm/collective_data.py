"""What one call of a collective needs, and how its result is checked exactly: the rank's Setup, the data each
rank sends (small integers, so every sum, mean and maximum is exact in bfloat16), the exact result, the test hook
that corrupts one element, and the buffers filled and compared a chunk at a time. lab.measure.bench.comm.collective
holds
the six collectives that use them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING

# For the checker only: torch comes in as Setup.torch, so this module imports without it; inside Setup that field
# hides the module's name, so the types are imported by names of their own.
if TYPE_CHECKING:
    from torch import Tensor
    from torch import device as Device
    from torch import dtype as DType
    from torch.distributed import ReduceOp

VALUES = 256  # data of the ops that reduce nothing: integers 0..255, exact in bfloat16 (8 significant bits)
PATTERN = 4  # data of the reductions: (i + r) % 4 on rank r, so every sum is a small integer (see exact_reductions)


@dataclass(frozen=True)
class Setup:
    """One rank's view of one size: torch, the rank's place, the element type and nccl-tests' count."""

    torch: ModuleType
    rank: int
    world_size: int
    device: Device
    dtype: DType
    count: int  # the count column: elements per rank (per block for alltoall) where the op is per rank
    op: str  # sum, avg or max; "none" for the ops that reduce nothing

    @property
    def tdist(self) -> ModuleType:
        return self.torch.distributed

    def reduce_op(self) -> ReduceOp:
        return {"sum": self.tdist.ReduceOp.SUM, "avg": self.tdist.ReduceOp.AVG, "max": self.tdist.ReduceOp.MAX}[self.op]

    def zeros(self, count: int) -> Tensor:
        return self.torch.zeros(count, dtype=self.dtype, device=self.device)

    def unwritten(self, count: int) -> Tensor:
        """An output buffer filled with -1: a value no input holds, so an element never written is counted."""
        return self.torch.full((count,), -1, dtype=self.dtype, device=self.device)

    def mine(self, buffer: Tensor) -> Tensor:
        """This rank's block of an n-block buffer."""
        return buffer[self.rank * self.count : (self.rank + 1) * self.count]


Bodies = tuple[Callable[[], object], Callable[[], object]]  # (out-of-place, in-place): one call each, timed in a loop


# A check builds its inputs and its expected values CHECK_CHUNK elements at a time, so what it holds beyond its
# buffers is a few chunks, whatever the size: at -e 8G a whole-buffer index (int64) and its arithmetic had kept
# 72 GiB alive on an 80 GB H100 beside the benchmark's own buffers (every node of `lab validate` ran out of memory).
CHECK_CHUNK = 1 << 22  # elements: 32 MiB an int64 temporary


def fill(s: Setup, out: Tensor, values: Callable[[Tensor], Tensor]) -> Tensor:
    """`out` (a buffer of s.dtype) filled with values(position), a chunk at a time; returned."""
    count = out.numel()
    for start in range(0, count, CHECK_CHUNK):
        out[start : start + CHECK_CHUNK] = values(
            s.torch.arange(start, min(count, start + CHECK_CHUNK), device=s.device)
        )
    return out


def filled(s: Setup, count: int, values: Callable[[Tensor], Tensor]) -> Tensor:
    """A new buffer of `count` elements of s.dtype holding values(position)."""
    return fill(s, s.torch.empty(count, dtype=s.dtype, device=s.device), values)


def count_wrong(s: Setup, out: Tensor, expected: Callable[[Tensor], Tensor], offset: int = 0) -> Tensor:
    """How many elements of `out` differ from expected(position + offset) (a tensor on the device), a chunk at a
    time."""
    wrong = s.torch.zeros((), dtype=s.torch.int64, device=s.device)
    for start in range(0, out.numel(), CHECK_CHUNK):
        end = min(out.numel(), start + CHECK_CHUNK)
        wrong += (out[start:end] != expected(s.torch.arange(start + offset, end + offset, device=s.device))).sum()
    return wrong


def rank_values(s: Setup, index: Tensor, rank: int) -> Tensor:
    """Data of rank `rank` at positions `index`: integers 0..255, different on every rank (31 is odd, so
    31 r mod 256 differs for up to 256 ranks)."""
    return ((index + 31 * rank) % VALUES).to(s.dtype)


def reduction_input(s: Setup, phase: Tensor) -> Tensor:
    """This rank's input at positions with the given phases: rank r holds (phase + r) % 4, times n for avg so the
    mean is an integer too."""
    scale = s.world_size if s.op == "avg" else 1
    return ((phase + s.rank) % PATTERN * scale).to(s.dtype)


def exact_reductions(s: Setup) -> Tensor:
    """The exact reduction for each of the PATTERN phases, as a tensor of s.dtype on the device.

    Every partial sum is an integer below 4n (4n + 4 with the test hook), exact in bfloat16 up to n = 64 and
    in float16 up to 512 ranks, so the check can demand exact equality."""
    n = s.world_size
    scale = n if s.op == "avg" else 1
    inputs = [[(k + r) % PATTERN * scale for r in range(n)] for k in range(PATTERN)]
    exact: dict[str, list[float]] = {
        "sum": [float(sum(v)) for v in inputs],
        "avg": [sum(v) / n for v in inputs],
        "max": [float(max(v)) for v in inputs],
    }
    return s.torch.tensor(exact[s.op], dtype=s.dtype, device=s.device)


def corrupt(s: Setup, x: Tensor, corrupt_rank: int | None) -> None:
    """Test hook: rank `corrupt_rank` sends one wrong element, its first. A reduction's is raised past every
    other input (so even MAX gets it wrong) and stays an exact integer; other data moves by 1 (at most 256)."""
    if corrupt_rank == s.rank:
        x[0] += 1 if s.op == "none" else PATTERN * (s.world_size if s.op == "avg" else 1)
