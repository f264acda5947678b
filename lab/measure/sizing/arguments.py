"""The command-line arguments of `lab memory` and `lab choose` (their rows are lab.measure.commands'), with the
argparse types of lab.run.config.arguments and the decision tree's own. Nothing here imports torch.
"""

from __future__ import annotations

import argparse

from lab.measure.sizing import choose as tree
from lab.run.config.arguments import PROCESSES, at_least, output_file


def memory_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--params", type=float, default=7e9, help="parameter count (default 7e9)")
    # --world-size and --node-size: memory.run checks them, with messages that name what a device count means
    p.add_argument("--world-size", type=int, default=8, help="devices (default 8)")
    p.add_argument("--optimizer", default="adam", choices=["adam", "adamw", "sgd-momentum", "sgd"])
    p.add_argument(
        "--precision",
        default="bf16",
        choices=["fp32", "bf16", "fp16"],
        help="fp32, or bf16/fp16 mixed precision with fp32 master weights (default bf16)",
    )
    p.add_argument(
        "--convention",
        default="zero",
        choices=["zero", "hf", "deepspeed"],
        help="bytes per parameter: zero (16 for mixed Adam), hf (18), or deepspeed (DeepSpeed's own "
        "estimators, 2 + 18/N) (default zero)",
    )
    p.add_argument("--node-size", type=int, help="devices per node, for FSDP hybrid shard (deepspeed: GPUs per node)")
    p.add_argument(
        "--largest-layer",
        type=float,
        metavar="PARAMS",
        help="parameters of the largest layer, for --convention deepspeed's ZeRO-3 rows (default 0)",
    )
    p.add_argument(
        "--bucket-mb",
        type=float,
        default=25.0,
        metavar="MIB",
        help="DeepSpeed's reduce bucket in MiB, shown beside the total (default 25: dist.bucket_cap_mb)",
    )
    p.add_argument(
        "--headroom",
        type=tree.FRACTION,
        default=tree.HEADROOM,
        metavar="FRACTION",
        help="part of device memory kept free for the CUDA context, fragmentation, NCCL (default 0.1)",
    )
    p.add_argument("--device", choices=["h100", "h200", "a100-80", "a100-40"], help="device to fit on")
    p.add_argument("--device-memory", type=float, metavar="GB", help="device memory in GB (instead of --device)")
    for name in ("seq-len", "micro-batch", "hidden", "heads", "layers"):
        p.add_argument(f"--{name}", type=at_least(1), help="transformer activation term (give all five)")
    p.add_argument("--measure", action="store_true", help="also measure ResNet-18: 1 process, DDP and FSDP")
    p.add_argument("--measure-width", type=at_least(1), default=64, help="ResNet-18 width for --measure (default 64)")
    p.add_argument("--json", type=output_file, metavar="PATH")
    p.add_argument("--plot", type=output_file, metavar="PNG", help="stacked bars of the estimate")


def choose_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--params",
        type=tree.parse_params,
        required=True,
        metavar="COUNT",
        help="parameter count: 7B, 70e9, 1.5T, 350M, 125e6",
    )
    p.add_argument("--gpus-per-node", type=PROCESSES, default=8, metavar="G", help="GPUs per node (default 8)")
    p.add_argument("--nodes", type=at_least(1, "{} nodes"), default=1, metavar="N", help="nodes (default 1)")
    device = p.add_mutually_exclusive_group()
    device.add_argument("--device", choices=sorted(tree.DEVICES_GB), help="GPU model (default h100)")
    device.add_argument(
        "--gpu-memory", type=tree.GPU_MEMORY_GB, metavar="GB", help="GPU memory in GB (instead of --device)"
    )
    p.add_argument(
        "--interconnect",
        default="ib-ndr",
        choices=list(tree.INTERCONNECT_GBPS),
        help="inter-node link, one NIC per GPU (default ib-ndr: 400 Gb/s)",
    )
    p.add_argument("--optimizer", default="adam", choices=["adam", "adamw", "sgd-momentum", "sgd"])
    p.add_argument(
        "--precision",
        default="bf16",
        choices=["fp32", "bf16", "fp16"],
        help="fp32, or bf16/fp16 mixed precision with fp32 master weights (default bf16)",
    )
    for name, says in (("seq-len", "tokens per sequence"), ("hidden", "hidden size"), ("layers", "layers")):
        p.add_argument(f"--{name}", type=at_least(1), help=f"{says}, for activations (give all three)")
    p.add_argument("--micro-batch", type=at_least(1), default=1, help="sequences per GPU per step (default 1)")
    p.add_argument("--heads", type=at_least(1), help="attention heads (default hidden/128)")
    p.add_argument(
        "--headroom",
        type=tree.FRACTION,
        default=tree.HEADROOM,
        metavar="FRACTION",
        help="part of GPU memory kept free for the CUDA context, fragmentation, NCCL (default 0.1)",
    )
    p.add_argument("--json", type=output_file, metavar="PATH", help="write the decisions and the choice as JSON")
