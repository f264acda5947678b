"""`lab memory`'s arithmetic: the ZeRO paper's figure, what each tool keeps in fp32, the hf rows, the headroom.

The strategies' measured bytes against these estimates: tests/unit/test_workshop.py (its `lab bench strategies`
step on 2 CPU ranks); DeepSpeed's own estimators: tests/unit/test_memory_deepspeed.py."""

from __future__ import annotations

import json

import pytest

from lab.measure.sizing import choose, memory
from tests.conftest import lab


def _totals(*args, **kwargs) -> dict[str, float]:
    return {r["strategy"]: r["total_bytes"] for r in memory.estimate(*args, **kwargs)}


def test_the_zero_convention_reproduces_figure_1_of_the_zero_paper():
    # Rajbhandari et al. 2020, Figure 1: 7.5B parameters, 64 devices, mixed-precision Adam (K = 12)
    gb = {k: round(v / 1e9, 2) for k, v in _totals(7.5e9, 64, "adam", "bf16", "zero").items()}
    assert gb == {"DDP": 120.0, "ZeRO-1": 31.41, "ZeRO-2": 16.64, "ZeRO-3 / FSDP full shard": 1.88}


def test_fp32_counts_deepspeeds_master_partition_and_fsdps_shards_in_place():
    p = 11_173_962  # ResNet-18 at width 64: lab bench strategies' model
    rows = {r["strategy"]: r for r in memory.estimate(p, 2, *memory.MEASURED_RECIPE)}
    assert list(rows) == ["DDP", "ZeRO-1", "ZeRO-2", "FSDP full shard", "ZeRO-3"]
    shard = 4 * p / 2  # one fp32 half of the model
    assert rows["DDP"]["total_bytes"] == 12 * p
    assert rows["FSDP full shard"]["total_bytes"] == 3 * shard  # parameters, gradients, momentum: halves
    # DeepSpeed: its fp32 master partition is one shard more of optimizer state, at every stage
    assert rows["ZeRO-1"]["optimizer_states_bytes"] == rows["ZeRO-3"]["optimizer_states_bytes"] == 2 * shard
    assert [rows[k]["total_bytes"] for k in ("ZeRO-1", "ZeRO-2", "ZeRO-3")] == [6 * shard, 5 * shard, 4 * shard]
    # The IPG bucket is its own key, outside the total: DeepSpeed's rows hold one, DDP and FSDP none
    assert [rows[k]["bucket_bytes"] for k in rows] == [0, 25 * 2**20, 25 * 2**20, 0, 25 * 2**20]


def test_hf_shards_the_fp32_master_weights_and_gradients_from_zero_1_as_deepspeed_does():
    gb = {k: v / 1e9 for k, v in _totals(7e9, 8, "adam", "bf16", "hf").items()}
    # 18 bytes unsharded; from ZeRO-1 on only the 16-bit weights stay whole: 2 x 7 + 16 x 7 / 8 (was 77.0 and 52.5)
    assert gb == {"DDP": 126.0, "ZeRO-1": 28.0, "ZeRO-2": 28.0, "ZeRO-3 / FSDP full shard": 15.75}


def test_the_recommendation_keeps_the_headroom_the_table_asks_for():
    assert memory.HEADROOM == choose.HEADROOM  # lab memory and lab choose keep the same part free
    rows = [
        {"strategy": "DDP", "total_bytes": 100e9},
        {"strategy": "ZeRO-1", "total_bytes": 76.8e9},
        {"strategy": "ZeRO-2", "total_bytes": 50e9},
    ]
    # ZeRO-1 at 96% of an 80 GB device fits the device but not its 90%: the next one is recommended
    assert memory.recommend(rows, 80e9).startswith("ZeRO-2: the least sharding that fits in 90% of the device")
    assert memory.recommend(rows, 80e9, headroom=0.0).startswith("ZeRO-1")
    table = memory.render(memory.estimate(7e9, 8, "adam", "bf16", "zero"), "t", 80e9)
    assert "fits = total <= 72,000,000,000 bytes" in table


def test_the_command_shows_the_device_in_its_vendors_unit_and_in_bytes(tmp_path):
    proc = lab("memory", "--params", "7e9", "--world-size", "8", "--device", "h100", "--json", str(tmp_path / "m.json"))
    assert "recommendation for h100 (80 GB): ZeRO-1: the least sharding that fits in 90% of the device" in proc.stdout
    assert (
        "80 GB = 80,000,000,000 bytes" in proc.stdout and "72,000,000,000 bytes for the training state" in proc.stdout
    )
    result = json.loads((tmp_path / "m.json").read_text())
    assert (result["device_memory_gb"], result["device_memory_bytes"], result["headroom"]) == (80.0, 80e9, 0.1)
    assert "| ZeRO-1 | 14.00 GB | 14.00 GB | 10.50 GB | - | 38.50 GB | yes | 25 MiB |" in proc.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["--convention", "deepspeed", "--precision", "fp32"], "DeepSpeed's estimator assumes mixed-precision Adam"),
        (["--convention", "deepspeed", "--optimizer", "sgd"], "DeepSpeed's estimator assumes mixed-precision Adam"),
        (["--convention", "deepspeed", "--world-size", "8", "--node-size", "3"], "takes whole nodes"),
        (
            ["--convention", "deepspeed", "--largest-layer", "9e9"],
            "--largest-layer 9e+09: the parameters of the largest",
        ),
        (["--convention", "deepspeed", "--plot", "m.png"], "--plot with --convention deepspeed"),
        (["--largest-layer", "1e6"], "--largest-layer: only --convention deepspeed uses it"),
        (["--bucket-mb", "-1"], "--bucket-mb -1: a bucket size in MiB"),
        (["--headroom", "1.5"], "--headroom: '1.5'; use a fraction"),
    ],
)
def test_a_bad_memory_flag_is_one_line_and_exit_2(tmp_path, args, message):
    proc = lab("memory", *args, check=False, cwd=tmp_path)
    assert proc.returncode == 2 and message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
