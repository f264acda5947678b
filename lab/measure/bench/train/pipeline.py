"""The lab's data path against a conventional torchvision DataLoader pipeline, interleaved A/B.

    lab bench pipeline --batch-size 256 --num-workers 2 --json pipeline.json

lab:         the data set as one uint8 tensor on the device; per batch an index, a gather,
             a batched crop/flip and a normalise (lab.run.data.DeviceLoader).
torchvision: PIL images, RandomCrop(32, padding=4), RandomHorizontalFlip, ToTensor,
             Normalize in DataLoader workers, then a host-to-device copy per batch.

Both are timed on the data path alone and inside full training steps (the lab's
Trainer), in alternating blocks so they see the same machine. Goal on a CPU: the
lab's data path at least 10x the DataLoader's at equal batch size.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:  # imported where used: `lab bench --help` must not wait for torch
    import torch
    from PIL import Image


class _PilDataset:
    """CIFAR-10 as torchvision's CIFAR10 class serves it: HWC uint8 arrays -> PIL -> transforms."""

    def __init__(
        self, images: torch.Tensor, labels: torch.Tensor, transform: Callable[[Image.Image], torch.Tensor]
    ) -> None:
        self.images = images.permute(0, 2, 3, 1).contiguous().numpy()
        self.labels: list[int] = labels.tolist()
        self.transform = transform

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        from PIL import Image

        return self.transform(Image.fromarray(self.images[index])), self.labels[index]


def torchvision_loader(
    images: torch.Tensor, labels: torch.Tensor, batch_size: int, num_workers: int, pin_memory: bool, seed: int
) -> torch.utils.data.DataLoader[Any]:
    import torch
    from torchvision import transforms

    from lab.run.data.augment import MEAN, STD

    transform = transforms.Compose(
        [
            transforms.RandomCrop(32, padding=4),
            transforms.RandomHorizontalFlip(),
            transforms.ToTensor(),
            transforms.Normalize(MEAN, STD),
        ]
    )
    return torch.utils.data.DataLoader(
        # map-style by protocol (__len__, __getitem__): the DataLoader needs no Dataset subclass, its stubs do
        cast("torch.utils.data.Dataset[Any]", _PilDataset(images, labels, transform)),
        batch_size=batch_size,
        shuffle=True,
        drop_last=True,
        num_workers=num_workers,
        pin_memory=pin_memory,
        persistent_workers=num_workers > 0,
        generator=torch.Generator().manual_seed(seed),
    )


def run(args: argparse.Namespace) -> int:
    import torch

    from lab.measure.bench.train import harness
    from lab.run import config
    from lab.run.training import runs

    cfg = harness.synthetic_config(
        config.load(args.config or "workshop-cpu", args.overrides), args.batch_size, batches=(args.batches + 1) * 2
    )
    with harness.trainer_session(cfg) as (ctx, trainer, dataset):
        # The same images for both paths; the DataLoader path starts from the host, as it would from disk.
        tv_loader = torchvision_loader(
            dataset.train_images.cpu(),
            dataset.train_labels.cpu(),
            args.batch_size,
            args.num_workers,
            ctx.device.type == "cuda",
            cfg.run.seed,
        )
        device, dtype = ctx.device, trainer.dtype
        memory_format = torch.channels_last if cfg.model.channels_last else torch.contiguous_format
        streams = {
            "lab": trainer.train_loader.forever(),
            "torchvision": itertools.chain.from_iterable(itertools.repeat(tv_loader)),
        }

        def next_batch(path: str) -> tuple[torch.Tensor, torch.Tensor]:
            inputs, labels = next(streams[path])
            if path == "torchvision":  # the copy to the device is part of this path's cost
                inputs = inputs.to(device, dtype=dtype, memory_format=memory_format, non_blocking=True)
                labels = labels.to(device, non_blocking=True)
            return inputs, labels

        def block(path: str, train: bool) -> float:
            def batches() -> None:
                for _ in range(args.batches):
                    inputs, labels = next_batch(path)
                    if train:
                        trainer.train_step(inputs, labels)

            # DataLoader workers keep prefetching after their block; let them finish so they do not
            # take the cores of the next block (either path's).
            time.sleep(args.settle_seconds)
            return args.batch_size * args.batches / harness.timed(ctx, batches)

        for path in ("lab", "torchvision"):  # warm-up: workers started, kernels chosen
            block(path, False)
            block(path, True)
        samples: dict[str, list[float]] = {f"{p}_{k}": [] for p in ("lab", "torchvision") for k in ("data", "train")}
        for _ in range(args.rounds):
            for kind in ("data", "train"):
                for path in ("lab", "torchvision"):
                    samples[f"{path}_{kind}"].append(block(path, kind == "train"))
    result = summarize(samples, args, str(ctx.device))
    print(render(result), flush=True)
    if args.json:
        runs.write_json(args.json, result)
    return 0


def summarize(samples: dict[str, list[float]], args: argparse.Namespace, device: str) -> dict[str, Any]:
    median = {k: statistics.median(v) for k, v in samples.items()}
    return {
        "benchmark": "pipeline",
        "device": device,
        "batch_size": args.batch_size,
        "num_workers": args.num_workers,
        "batches_per_block": args.batches,
        "rounds": args.rounds,
        "images_per_second": samples,
        "median_images_per_second": median,
        "data_ratio_lab_over_torchvision": median["lab_data"] / median["torchvision_data"],
        "train_ratio_lab_over_torchvision": median["lab_train"] / median["torchvision_train"],
        "goal_data_ratio": 10.0,
    }


def render(r: dict[str, Any]) -> str:
    m = r["median_images_per_second"]
    return "\n".join(
        [
            f"data pipelines on {r['device']}, batch {r['batch_size']}, DataLoader workers {r['num_workers']}, "
            f"median of {r['rounds']} interleaved blocks of {r['batches_per_block']} batches",
            "| path | lab (images/s) | torchvision DataLoader (images/s) | lab / torchvision |",
            "|---|---:|---:|---:|",
            f"| data path alone | {m['lab_data']:.0f} | {m['torchvision_data']:.0f} | "
            f"{r['data_ratio_lab_over_torchvision']:.1f}x |",
            f"| full training step | {m['lab_train']:.0f} | {m['torchvision_train']:.0f} | "
            f"{r['train_ratio_lab_over_torchvision']:.2f}x |",
            f"goal: data path >= {r['goal_data_ratio']:.0f}x: "
            f"{'met' if r['data_ratio_lab_over_torchvision'] >= r['goal_data_ratio'] else 'missed'}",
        ]
    )
