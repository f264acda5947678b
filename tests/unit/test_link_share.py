"""The "% of link" figure of the collective benchmarks: NVLink's stated 450 GB/s per direction as the reference,
and an honest word when NVLS all-reduce (in-switch reduction, ~480 GB/s busbw on 8 H100s) passes it."""

from __future__ import annotations

from lab.measure.bench.comm.collective import COLLECTIVES
from lab.measure.bench.comm.collective_perf import Row, render
from lab.measure.bench.comm.collective_plan import LINKS


def _row(busbw: float) -> Row:
    size = 256 * 2**20
    return Row(
        size=size,
        count=size // 4,
        type="float",
        redop="sum",
        root=-1,
        oop_time_us=1.0,
        oop_algbw=busbw,
        oop_busbw=busbw,
        oop_wrong=0,
        ip_time_us=1.0,
        ip_algbw=busbw,
        ip_busbw=busbw,
        ip_wrong=0,
    )


def _link_line(busbw: float) -> str:
    text = render(COLLECTIVES["all_reduce"], [_row(busbw)], 8, "nccl", "nvlink4")
    return text.splitlines()[-1]


def test_nvls_busbw_above_nvlink_says_why_instead_of_a_bare_figure_over_100_percent():
    assert LINKS["nvlink4"][0] == 450.0 and "per direction" in LINKS["nvlink4"][1]  # the reference is kept
    line = _link_line(480.0)
    assert "106.7% of it" in line and "NVLS" in line and "in-switch" in line


def test_a_busbw_within_the_link_is_a_plain_share():
    line = _link_line(360.0)
    assert "best busbw is 80.0% of it, average 80.0%" in line and "NVLS" not in line
