"""What every training forward feeds a layer that keeps running statistics (BatchNorm, SyncBatchNorm, a learner's
own with a `running_mean` buffer), recorded for the fix-batchnorm check: from these per-channel sums it replays
the statistics of the global batch (lab.course.exercises.fix_batchnorm.global_batch).

Events: "norm" once a layer (its model's index, its name, momentum and starting buffers), then "norm_batch" for each
of its forwards in training mode (the per-channel sum and sum of squares of its input, in float64, and the count).
On the CPU each is written at once. On a GPU reading the sums would make the learner's step loop wait for the
device at every forward: they are kept on the device and read together when the rank ends (or every PENDING
forwards), in order, as the recorder does with CUDA losses.
"""

from __future__ import annotations

import atexit
from typing import Any

from lab.course.exercises.recorder import Recorder, values

PENDING = 1024  # device forwards kept unread at most: then read together (one host sync per this many)


class DeviceSums:
    """The forwards whose sums are still on the device, read in one host sync."""

    def __init__(self, rec: Recorder) -> None:
        self.rec = rec
        self.kept: list[tuple[int, str, int, Any]] = []  # (model, layer name, count, [sum; sumsq] on the device)
        atexit.register(self.read)  # registered after the recorder's own end: runs before it (atexit is LIFO)

    def keep(self, model: int, name: str, n: int, sums: Any) -> None:
        self.kept.append((model, name, n, sums))
        if len(self.kept) >= PENDING:
            self.read()

    def read(self) -> None:
        import torch

        if not self.kept:
            return
        kept, self.kept = self.kept, []
        read = torch.stack([sums for *_, sums in kept]).cpu().tolist()  # the one host sync
        for (model, name, n, _), (total, squares) in zip(kept, read):
            self.rec.write("norm_batch", model=model, name=name, n=n, sum=total, sumsq=squares)


def watch(rec: Recorder, model: int, module: Any) -> None:
    """Each layer with running statistics records what every training forward feeds it (a forward pre-hook: it
    reads the input, changes nothing). Buffers as DDP's construction left them: rank 0's, broadcast."""
    device_sums: DeviceSums | None = None
    for name, layer in module.named_modules():
        running = getattr(layer, "running_mean", None)
        if running is None or not hasattr(running, "shape"):
            continue
        start = {n: values(b) for n, b in layer.named_buffers(recurse=False)}
        rec.write("norm", model=model, name=name, momentum=getattr(layer, "momentum", 0.1), start=start)
        device_sums = device_sums or DeviceSums(rec)

        def batch(layer: Any, inputs: tuple[Any, ...], name: str = name, kept: DeviceSums = device_sums) -> None:
            if not layer.training or not inputs or not hasattr(inputs[0], "dim") or inputs[0].dim() < 2:
                return
            import torch

            x = inputs[0].detach().double()
            dims = [d for d in range(x.dim()) if d != 1]  # every dimension but the channels
            sums = torch.stack([x.sum(dims), (x * x).sum(dims)])
            n = x.numel() // x.shape[1]
            if x.device.type != "cpu":
                kept.keep(model, name, n, sums)
            else:
                total, squares = sums.tolist()
                rec.write("norm_batch", model=model, name=name, n=n, sum=total, sumsq=squares)

        layer.register_forward_pre_hook(batch)
