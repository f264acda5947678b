"""nccl-tests' definitions, checked against hand-computed values."""

from __future__ import annotations

import pytest

from lab.errors import LabError
from lab.measure.bench.comm.allreduce import busbw
from lab.measure.bench.comm.collective_perf import Row, algbw, average_busbw
from lab.measure.bench.comm.collective_plan import parse_size, size_steps


@pytest.mark.parametrize("n, factor", [(2, 1.0), (4, 1.5), (8, 1.75)])
def test_busbw_is_algbw_times_2_n_minus_1_over_n(n, factor):
    # 256 MiB in 10 ms: algbw = 268435456 / 0.01 / 1e9 = 26.8435456 GB/s
    a = algbw(268435456, 0.01)
    assert a == pytest.approx(26.8435456)
    assert busbw(a, n) == pytest.approx(26.8435456 * factor)


def test_sizes_follow_begin_end_factor():
    assert size_steps(8, 64, 2) == [8, 16, 32, 64]
    assert size_steps(parse_size("1K"), parse_size("4K"), 2) == [1024, 2048, 4096]
    with pytest.raises(LabError, match="the step factor must be above 1"):
        size_steps(8, 64, 1)
    with pytest.raises(LabError, match="expected bytes with an optional K, M or G suffix"):
        parse_size("lots")


def test_average_covers_out_of_place_and_in_place():
    rows = [
        Row(8, 2, "float", "sum", -1, 1, 1, 1.0, 0, 1, 1, 3.0, 0),
        Row(16, 4, "float", "sum", -1, 1, 1, 2.0, 0, 1, 1, 6.0, 0),
    ]
    assert average_busbw(rows) == 3.0
