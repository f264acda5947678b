"""The grader's side of `ring-allreduce`, run in every rank by `lab.course.exercises.observe --probe`: it calls the
learner's ring_all_reduce with tensors of its own and writes what it found to the rank's trace as "probe" events.

    probe  what="call", phase="begin"/"end", numel   around each graded call: the collectives recorded between
                                                     the two are the learner's own
    probe  what="result", numel, wrong, first_wrong, max_diff, returned_right
                                                     the tensor after the call against dist.all_reduce's
    probe  what="error", numel, error                the call raised (the rank then exits: its peers may be
                                                     waiting on it, and torchrun stops them)
    probe  what="timing", bytes, yours, library      seconds per call at BANDWIDTH_NUMEL, alternating
    probe  what="missing"                            the file has no ring_all_reduce

The learner's file is loaded as a module, not run: its __main__ block (its own try) never runs here.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch
import torch.distributed as dist

from lab.course.exercises import probe_rank

SIZES = (1, 7, 1200, 4099)  # 1200 divides by 2, 3 and 4; the others by none of them (1: fewer than the ranks)
BANDWIDTH_NUMEL = 1 << 20  # 4 MiB of float32: large enough that the time is bandwidth more than latency
REPEATS = 5  # timed calls of each, after one warm-up
RTOL = ATOL = 1e-5  # float32 sums in another order: a few ulps apart, far below any wrong chunk
FUNCTION = "ring_all_reduce"


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _compare(numel: int, given: torch.Tensor, returned: Any, expected: torch.Tensor) -> dict[str, Any]:
    close = torch.isclose(given, expected, rtol=RTOL, atol=ATOL)
    wrong = (~close).nonzero().flatten().tolist()
    returned_right = (
        bool(wrong)
        and isinstance(returned, torch.Tensor)
        and returned.shape == expected.shape
        and bool(torch.allclose(returned.to(expected.device), expected, rtol=RTOL, atol=ATOL))
    )
    return {
        "numel": numel,
        "wrong": len(wrong),
        "first_wrong": wrong[0] if wrong else None,
        "max_diff": float((given - expected).abs().max()) if numel else 0.0,
        "returned_right": returned_right,
    }


def _graded_call(function: Any, numel: int, device: torch.device, recorder: Any) -> None:
    rank = dist.get_rank()
    generator = torch.Generator().manual_seed(1000 * numel + rank)  # each rank its own numbers
    mine = torch.randn(numel, generator=generator).to(device)
    expected = mine.clone()
    dist.all_reduce(expected)
    given = mine.clone()
    dist.barrier()
    recorder.write("probe", what="call", phase="begin", numel=numel)
    try:
        returned = function(given)
        _synchronize(device)
    except Exception as exc:
        recorder.write("probe", what="error", numel=numel, error=f"{type(exc).__name__}: {exc}"[:300])
        raise
    recorder.write("probe", what="call", phase="end", numel=numel)
    recorder.write("probe", what="result", **_compare(numel, given, returned, expected))


def _timed(function: Any, tensor: torch.Tensor, device: torch.device) -> float:
    dist.barrier()  # every rank starts together: the time is the collective's, not the wait for a late rank
    _synchronize(device)
    started = time.perf_counter()
    function(tensor)
    _synchronize(device)
    return time.perf_counter() - started


def _timing(function: Any, device: torch.device, recorder: Any) -> None:
    source = torch.randn(BANDWIDTH_NUMEL, generator=torch.Generator().manual_seed(dist.get_rank())).to(device)
    yours, library = [], []
    for _ in range(REPEATS + 1):  # alternating, so a machine busy for a moment slows both alike
        yours.append(_timed(function, source.clone(), device))
        library.append(_timed(dist.all_reduce, source.clone(), device))
    recorder.write(
        "probe",
        what="timing",
        bytes=source.numel() * source.element_size(),
        yours=yours[1:],
        library=library[1:],
        yours_median=statistics.median(yours[1:]),
        library_median=statistics.median(library[1:]),
    )


def probe(learner: dict[str, Any], recorder: Any, trace_dir: str) -> None:
    device = probe_rank.setup()
    function = learner.get(FUNCTION)
    if not callable(function):
        recorder.write("probe", what="missing")
    else:
        for numel in SIZES:
            _graded_call(function, numel, device, recorder)
        _timing(function, device, recorder)
    dist.barrier()
    dist.destroy_process_group()
