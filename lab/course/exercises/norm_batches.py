"""What every training forward feeds a layer that keeps running statistics (BatchNorm, SyncBatchNorm, a learner's
own with a `running_mean` buffer), recorded for the fix-batchnorm check: from these per-channel sums it replays
the statistics of the global batch (lab.course.exercises.fix_batchnorm.global_batch).

Events: "norm" once a layer (its model's index, its name, momentum and starting buffers), then "norm_batch" at each
of its forwards in training mode (the per-channel sum and sum of squares of its input, in float64, and the count).
"""

from __future__ import annotations

from typing import Any

from lab.course.exercises.recorder import Recorder, values


def watch(rec: Recorder, model: int, module: Any) -> None:
    """Each layer with running statistics records what every training forward feeds it (a forward pre-hook: it
    reads the input, changes nothing). Buffers as DDP's construction left them: rank 0's, broadcast."""
    for name, layer in module.named_modules():
        running = getattr(layer, "running_mean", None)
        if running is None or not hasattr(running, "shape"):
            continue
        start = {n: values(b) for n, b in layer.named_buffers(recurse=False)}
        rec.write("norm", model=model, name=name, momentum=getattr(layer, "momentum", 0.1), start=start)

        def batch(layer: Any, inputs: tuple[Any, ...], name: str = name) -> None:
            if not layer.training or not inputs or not hasattr(inputs[0], "dim") or inputs[0].dim() < 2:
                return
            x = inputs[0].detach().double()
            dims = [d for d in range(x.dim()) if d != 1]  # every dimension but the channels
            rec.write(
                "norm_batch",
                model=model,
                name=name,
                n=x.numel() // x.shape[1],
                sum=x.sum(dims).cpu().tolist(),
                sumsq=(x * x).sum(dims).cpu().tolist(),
            )

        layer.register_forward_pre_hook(batch)
