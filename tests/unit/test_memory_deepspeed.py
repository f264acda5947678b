"""`lab memory --convention deepspeed` equals DeepSpeed's own estimators, byte for byte: the installed DeepSpeed's
functions are called beside the command. Skips, saying so, where DeepSpeed is not installed, unless
LAB_REQUIRE_DEEPSPEED=1 (make test's main run), where a missing DeepSpeed fails."""

from __future__ import annotations

import itertools
import json

import pytest

from lab.measure.sizing import deepspeed_estimate
from tests.conftest import lab, require_deepspeed

require_deepspeed()


@pytest.fixture(scope="module")
def estimators():
    # DeepSpeed picks its accelerator on import and says so on stderr; the functions themselves are arithmetic
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    return estimate_zero2_model_states_mem_needs, estimate_zero3_model_states_mem_needs


def test_seven_billion_on_eight_devices_equals_deepspeeds_estimate(tmp_path, estimators):
    zero2, zero3 = estimators
    largest = 131_072_000  # a 7B LLaMA's embedding, 32000 x 4096: its largest layer
    proc = lab(
        "memory",
        "--convention",
        "deepspeed",
        "--params",
        "7e9",
        "--world-size",
        "8",
        "--largest-layer",
        str(largest),
        "--device",
        "h100",
        "--json",
        str(tmp_path / "m.json"),
    )
    rows = json.loads((tmp_path / "m.json").read_text())["rows"]
    expected = [zero2(7_000_000_000, 8, 1, cpu_offload=o) for o in (True, False)]
    expected += [
        zero3(7_000_000_000, largest, 8, 1, cpu_offload=o, cpu_offload_params=op, zero_init=z)[:2]
        for o, op in ((True, True), (True, False), (False, False))
        for z in (True, False)
    ]
    assert [(r["cpu_bytes"], r["gpu_bytes"]) for r in rows] == expected
    assert expected[1] == (336_000_000_000, 29_750_000_000)  # 2 x 7e9 + 18 x 7e9 / 8 on the GPU
    assert "27.71 GiB (29,750,000,000 bytes)" in proc.stdout  # DeepSpeed prints "27.71GB": GiB, said as GiB
    assert "ZeRO-1/2 (offload_optimizer=none): the least sharding and offload that fits" in proc.stdout


def test_every_layout_and_option_equals_deepspeeds_arithmetic(estimators):
    zero2, zero3 = estimators
    for params, largest, per_node, nodes in itertools.product(
        (7e9, 1_234_567_891, 11_173_962), (0, 2_359_296, 131e6), (1, 3, 8), (1, 2, 64)
    ):
        for offload in (True, False):
            assert deepspeed_estimate.zero2(params, per_node, nodes, offload) == zero2(params, per_node, nodes, offload)
            for offload_params, zero_init in itertools.product((True, False), (True, False)):
                assert deepspeed_estimate.zero3(
                    params, largest, per_node, nodes, offload, offload_params, zero_init
                ) == zero3(params, largest, per_node, nodes, offload, offload_params, zero_init)
