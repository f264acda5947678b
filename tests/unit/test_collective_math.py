"""nccl-tests' size and busbw factor of each collective, checked against hand-computed values."""

from __future__ import annotations

import argparse

import pytest

from lab.errors import LabError
from lab.measure.bench.comm import collective_plan
from lab.measure.bench.comm.collective import COLLECTIVES, NAMES, parse_names
from lab.measure.bench.comm.collective_perf import Row, algbw, average_busbw, format_row
from lab.measure.bench.comm.collective_plan import json_paths

# nccl-tests' src/*.cu GetBw: busbw / algbw for n ranks
FACTORS = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "alltoall": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "sendrecv": lambda n: 1.0,
}


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("n", [2, 4, 8])
def test_busbw_factor_per_op(name, n):
    # 256 MiB in 10 ms: algbw = 268435456 / 0.01 / 1e9 = 26.8435456 GB/s, whatever the op
    a = algbw(268435456, 0.01)
    assert a == pytest.approx(26.8435456)
    assert a * COLLECTIVES[name].factor(n) == pytest.approx(26.8435456 * FACTORS[name](n))
    assert {2: 1.0, 4: 1.5, 8: 1.75}[n] == pytest.approx(COLLECTIVES["all_reduce"].factor(n))


@pytest.mark.parametrize(
    "name, size, element, n, expected",
    [
        # the whole buffer: the count column counts its elements
        ("all_reduce", 1000, 4, 8, (250, 1000)),
        ("broadcast", 1000, 2, 8, (500, 1000)),
        ("sendrecv", 6, 4, 2, (1, 4)),
        # per rank: the size is the total (all_gather's output, reduce_scatter's input, alltoall's n blocks), the
        # count per rank rounded down to whole 16-byte blocks (4 floats, 8 halves), as nccl-tests' GetCollByteCount
        ("all_gather", 1024, 4, 4, (64, 1024)),
        ("all_gather", 100, 4, 2, (12, 96)),
        ("all_gather", 8, 4, 2, (0, 0)),
        ("reduce_scatter", 100, 2, 2, (24, 96)),
        ("alltoall", 4096, 4, 8, (128, 4096)),
        ("alltoall", 1000, 4, 3, (80, 960)),
    ],
)
def test_sizes_per_op_follow_nccl_tests(name, size, element, n, expected):
    assert COLLECTIVES[name].counts(size, element, n) == expected


def test_what_reduces_and_where_the_root_is():
    assert [n for n in NAMES if COLLECTIVES[n].reduces] == ["all_reduce", "reduce_scatter"]
    assert {n: COLLECTIVES[n].root for n in NAMES}["broadcast"] == 0
    assert [n for n in NAMES if not COLLECTIVES[n].in_place_checked] == ["alltoall", "sendrecv"]


def test_ops_by_name_list_or_all():
    assert parse_names("all") == list(NAMES)
    assert parse_names("sendrecv, broadcast") == ["sendrecv", "broadcast"]
    for bad, message in (
        ("allgather", "OP allgather: unknown collective"),
        ("", "unknown collective"),
        ("broadcast,broadcast", "named twice"),
    ):
        with pytest.raises(LabError, match=message):
            parse_names(bad)


def test_one_json_per_op_when_several():
    assert json_paths("r/c.json", ["alltoall"]) == {"alltoall": "r/c.json"}
    assert json_paths("r/c.json", ["alltoall", "sendrecv"]) == {
        "alltoall": "r/c-alltoall.json",
        "sendrecv": "r/c-sendrecv.json",
    }


def test_in_place_not_checked_prints_n_a_and_still_counts_in_the_average():
    row = Row(64, 16, "float", "none", -1, 1.0, 1.0, 0.5, 0, 1.0, 1.0, 1.5, None)
    assert format_row(row).endswith("   N/A") and average_busbw([row]) == 1.0


def _args(ops: str, **given) -> argparse.Namespace:
    return argparse.Namespace(
        **{"collectives": ops, "minbytes": "8", "maxbytes": "1K", "stepfactor": 2.0, "link": None, "op": None, **given}
    )


@pytest.mark.parametrize("backend", ["gloo", "nccl"])
def test_what_a_backend_cannot_do_is_refused(monkeypatch, backend):
    monkeypatch.setattr(collective_plan, "expected_backend", lambda: backend)
    plan = collective_plan.plan(_args("all", op="max"), "collective")
    assert plan.op == "max" and plan.sizes == [8, 16, 32, 64, 128, 256, 512, 1024]
    assert plan.names == list(NAMES)  # gloo's reduce-scatter is the lab's ring over send/recv
    if backend == "gloo":
        with pytest.raises(LabError, match="--op avg: the gloo backend has no AVG reduction"):
            collective_plan.plan(_args("all_reduce", op="avg"), "collective")
    else:
        assert collective_plan.plan(_args("reduce_scatter", op="avg"), "collective").names == ["reduce_scatter"]
    with pytest.raises(LabError, match="--op sum: alltoall, sendrecv reduce nothing"):
        collective_plan.plan(_args("alltoall,sendrecv", op="sum"), "collective")
