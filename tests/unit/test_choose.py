"""`lab choose`: the lecture's decision tree (DDP, ZeRO-1/2, full/hybrid shard, offload) walked with numbers."""

from __future__ import annotations

import json
import shlex

import pytest

from lab.cli import build_parser
from lab.errors import LabError
from lab.measure.sizing import choose, choose_output
from lab.measure.sizing.choose import Request, decide, parse_params
from lab.measure.sizing.choose_output import render
from lab.measure.sizing.memory import activation_bytes
from tests.conftest import PYTHON, lab, run


def _choose(capsys, *args: str) -> str:
    """Parse `lab choose ARGS` with the real parser and run its handler; what it printed."""
    parsed = build_parser().parse_args(["choose", *args])
    assert parsed.handler(parsed) == 0
    return capsys.readouterr().out


def _parses(line: str) -> list[str]:
    """The `lab train` line a choice prints parses with the lab's own parser; its --set overrides."""
    words = shlex.split(line)
    assert words[0] == "lab"
    args = build_parser().parse_args(words[1:])
    if args.command == "launch":
        target = args.target[1:] if args.target[:1] == ["--"] else args.target
        assert target[:3] == ["-m", "lab", "train"]
        args = build_parser().parse_args(target[2:])
    assert args.command == "train" and args.config == "ddp"
    return args.overrides


def test_the_lecture_case_7b_on_8_h100_is_zero_1(capsys):
    # 7e9 x 16 bytes (bf16 + Adam, ZeRO convention) = 112 GB per GPU under DDP > 72 GB (80 GB less 10%);
    # ZeRO-1: 14 + 14 + 84/8 = 38.5 GB, leaving 33.5 GB (more than 10% of 72) for activations.
    out = _choose(capsys, "--params", "7B", "--gpus-per-node", "8", "--device", "h100")
    assert "1. DDP" in out and "no: 112 GB per GPU > 72 GB usable" in out
    assert "2. ZeRO-1/2" in out and "ZeRO-1 yes: 38.5 GB per GPU <= 72 GB usable" in out
    assert "choice: ZeRO-1" in out
    line = out.strip().splitlines()[-1]
    assert line == "lab train --config ddp --nproc-per-node 8 --set dist.strategy=deepspeed --set dist.zero_stage=1"
    assert _parses(line) == ["dist.strategy=deepspeed", "dist.zero_stage=1"]
    assert decide(Request(7e9)).strategy == "zero-1"


def test_zero_2_when_zero_1_fits_without_room_for_activations():
    # 13B: ZeRO-1 = 26 + 26 + 156/8 = 71.5 GB <= 72 GB but leaves 0.5 GB; ZeRO-2 = 26 + 3.25 + 19.5 = 48.75 GB.
    choice = decide(Request(13e9))
    assert choice.strategy == "zero-2"
    assert "leaving 0.5 GB for activations (< 10%)" in choice.decisions[1].answer
    assert choice.lab_train.endswith("--set dist.strategy=deepspeed --set dist.zero_stage=2")


def test_70b_on_two_nodes_full_shards_whatever_the_link():
    # 70e9 x 16 = 1120 GB of training state. Over 16 GPUs: 70 GB <= 72 GB usable (80 x 0.9): full shard fits.
    # Hybrid (full shard in a node of 8, replicate across the 2 nodes): 1120 / 8 = 140 GB > 72 GB: does not fit,
    # so on any link the answer is full shard over all 16 GPUs; the link only changes what that costs:
    # (2 all-gathers + 1 reduce-scatter of 140 GB) x 15/16 = 393.75 GB per GPU per step over the inter-node link.
    fast = decide(Request(70e9, gpus_per_node=8, nodes=2, link_gbps=choose.INTERCONNECT_GBPS["ib-ndr"]))
    slow = decide(Request(70e9, gpus_per_node=8, nodes=2, link_gbps=choose.INTERCONNECT_GBPS["ethernet-25"]))
    for choice in (fast, slow):
        assert choice.strategy == "fsdp-full"
        assert [d.question.split(":")[0] for d in choice.decisions] == ["DDP", "ZeRO-1/2", "full shard", "across nodes"]
        assert "yes: 70 GB per GPU <= 72 GB usable" in choice.decisions[2].answer
        assert "hybrid (node of 8) no: 140 GB per GPU > 72 GB usable" in choice.decisions[3].answer
        assert choice.lab_train.startswith("lab launch --nnodes 2 --nproc-per-node 8 --rdzv-endpoint HEAD:29400")
        assert _parses(choice.lab_train) == ["dist.strategy=fsdp"]
    assert "50 GB/s per GPU < 100 GB/s: slow" in fast.decisions[3].answer
    assert "3.125 GB/s per GPU < 100 GB/s: slow" in slow.decisions[3].answer
    assert fast.decisions[3].numbers["full_shard_link_seconds"] == pytest.approx(393.75 / 50)
    assert slow.decisions[3].numbers["full_shard_link_seconds"] == pytest.approx(393.75 / 3.125)  # 126 s a step


@pytest.mark.parametrize(
    "link, strategy", [("ib-ndr", "fsdp-hybrid"), ("ethernet-25", "fsdp-hybrid"), ("nvlink-nvl72", "fsdp-full")]
)
def test_the_link_picks_hybrid_shard_when_hybrid_fits(link, strategy):
    # 30B: full shard 480/16 = 30 GB; hybrid 480/8 = 60 GB <= 72 GB. Below 100 GB/s per GPU, keep sharding in a node.
    choice = decide(Request(30e9, gpus_per_node=8, nodes=2, link_gbps=choose.INTERCONNECT_GBPS[link]))
    assert choice.strategy == strategy
    assert "hybrid (node of 8) yes: 60 GB per GPU <= 72 GB usable" in choice.decisions[-1].answer
    assert any("2-D device mesh" in note for note in choice.notes) == (strategy == "fsdp-hybrid")


def test_a_125m_model_is_ddp():
    choice = decide(Request(parse_params("125M")))
    assert choice.strategy == "ddp" and len(choice.decisions) == 1
    assert choice.decisions[0].answer.startswith("yes: 2 GB per GPU <= 72 GB usable")
    assert _parses(choice.lab_train) == []
    assert render(choice).splitlines()[1:] == [
        f"2. Horovod? {choose_output.horovod_line(True)}",
        "choice: DDP",
        "lab train --config ddp --nproc-per-node 8",
    ]


def test_a_1_5t_model_on_8_gpus_offloads_or_needs_334_gpus():
    # 1.5e12 x 16 = 24,000 GB; at 72 GB usable a GPU, full sharding needs 24000 / 72 = 333.3 -> 334 GPUs.
    choice = decide(Request(1.5e12))
    assert choice.strategy == "offload"
    offload = choice.decisions[-1]
    assert offload.numbers["smallest_gpus"] == 334
    assert "2928 GB per GPU" in offload.answer and "full sharding fits at 334 GPUs (42 nodes of 8)" in offload.answer
    assert any(note.startswith("tensor/pipeline parallelism") for note in choice.notes)  # 375 GB of weights a GPU
    assert choice.lab_train.startswith("lab launch --nnodes 42 --nproc-per-node 8")
    assert decide(Request(1.5e12, gpus_per_node=334)).strategy == "fsdp-full"
    assert decide(Request(1.5e12, gpus_per_node=333)).strategy == "offload"


def test_activations_that_fit_nowhere_leave_no_lab_train_line(capsys):
    # 80 layers x 4096 x 8192 x (34 + 5 x 64 x 4096 / 8192) bytes = 520.76 GB of activations > 126.9 GB usable.
    out = _choose(
        capsys,
        "--params",
        "1.5T",
        "--nodes",
        "64",
        "--gpu-memory",
        "141",
        "--seq-len",
        "4096",
        "--hidden",
        "8192",
        "--layers",
        "80",
    )
    assert "activations alone (520.76 GB) exceed 126.9 GB" in out
    assert "note: tensor/pipeline parallelism (beyond the lab)" in out
    assert out.strip().splitlines()[-1] == "(no lab train line: see the notes)"
    assert activation_bytes(4096, 1, 8192, 64, 80) == pytest.approx(520.76e9, rel=1e-4)  # --heads: hidden / 128


def test_activations_count_in_every_row():
    layer = activation_bytes(2048, 1, 4096, 32, 1)
    with_them = decide(Request(1e9, activations_bytes=32 * layer, layer_activations_bytes=layer))
    assert with_them.decisions[0].numbers["activations_bytes"] == 32 * layer
    assert with_them.decisions[0].numbers["total_bytes"] == pytest.approx(16e9 + 32 * layer)


@pytest.mark.parametrize(
    "text, value",
    [
        ("7B", 7e9),
        ("70e9", 70e9),
        ("1.5T", 1.5e12),
        ("350M", 350e6),
        ("125e6", 125e6),
        ("7 B", 7e9),
        ("7b", 7e9),
        ("100", 100.0),
    ],
)
def test_params_parse(text, value):
    assert parse_params(text) == value


@pytest.mark.parametrize("text", ["", "seven", "7X", "7  B", "1e9B", "-7B", "0", "0.5", "nan", "inf", "1e400", "7B7"])
def test_params_refused(text):
    with pytest.raises(LabError, match="--params"):
        parse_params(text)


@pytest.mark.parametrize(
    "args, says",
    [
        (["--device", "h100", "--gpu-memory", "80"], "not allowed with argument --device"),
        (["--seq-len", "4096"], "--seq-len, --hidden, --layers: give all three"),
        (["--heads", "32"], "--seq-len, --hidden, --layers: give all three"),
        (["--gpu-memory", "0"], "--gpu-memory: '0' GB; use a positive size"),
        (["--headroom", "1"], "--headroom: '1'; use a fraction"),
        (["--nodes", "0"], "--nodes: 0 nodes; use 1 or more"),
    ],
)
def test_bad_input_is_one_lab_error(capsys, args, says):
    with pytest.raises(LabError, match=says) as error:
        _choose(capsys, "--params", "7B", *args)
    assert "\n" not in str(error.value)


def test_the_command_writes_json_and_never_imports_torch(tmp_path):
    proc = lab("choose", "--params", "70B", "--nodes", "2", "--json", str(tmp_path / "choice.json"), cwd=tmp_path)
    assert "(no --device or --gpu-memory: assuming h100)" in proc.stdout
    assert (
        "Horovod? no: it shards nothing (a whole replica per GPU, as DDP, which does not fit); last release 0.28.1 "
        "(June 2023)" in proc.stdout
    )
    result = json.loads((tmp_path / "choice.json").read_text())
    assert (result["params"], result["gpus"], result["device_memory_bytes"]) == (70e9, 16, 80e9)
    assert [set(d) for d in result["decisions"]] == [{"question", "answer", "numbers"}] * 4
    assert result["decisions"][2]["numbers"]["total_bytes"] == 70e9
    assert result["choice"]["strategy"] == "fsdp-full"
    assert result["choice"]["lab_train"] == proc.stdout.strip().splitlines()[-1]
    no_torch = (
        "import sys, lab.cli, lab.measure.sizing.choose; lab.cli.build_parser(); assert 'torch' not in sys.modules"
    )
    run([PYTHON, "-c", no_torch])  # the CLI stays fast: the parser and lab.measure.sizing.choose leave torch unimported
