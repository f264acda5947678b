"""The running statistics a BatchNorm layer would end with had every forward seen the global batch (every rank's
inputs together), as SyncBatchNorm computes them: replayed from the per-channel sums the observer recorded.

Each training forward moves the running statistics towards that batch's: running = (1 - f) running + f batch, f
the layer's momentum (None: a cumulative average, f = 1 / batches tracked), the variance unbiased (n - 1), as
torch's BatchNorm and SyncBatchNorm do. The same replay over rank 0's inputs alone gives what a copy of rank 0's
statistics holds (DDP's broadcast_buffers), and over each rank's alone, then averaged, what an average of the
ranks' finished statistics holds: the two half-fixes the check names.

>>> one = [(2, [2.0], [2.0])]                 # a batch of two samples, both 1.0, on one rank
>>> replay({"running_mean": [0.0], "running_var": [1.0]}, 0.5, [one])
{'running_mean': [0.5], 'running_var': [0.5]}
>>> two = [(2, [0.0], [0.0])]                 # the other rank: two samples at 0.0; together mean 0.5, var 1/3
>>> both = replay({"running_mean": [0.0], "running_var": [1.0]}, 1.0, [one, two])
>>> both["running_mean"], [round(v, 4) for v in both["running_var"]]
([0.5], [0.3333])
"""

from __future__ import annotations

from collections.abc import Sequence

# One forward on one rank: (samples per channel, per-channel sum, per-channel sum of squares)
Batch = tuple[int, list[float], list[float]]


def replay(start: dict[str, list[float]], momentum: float | None, per_rank: Sequence[Sequence[Batch]]) -> dict:
    """{"running_mean": [...], "running_var": [...]} after every forward of `per_rank` (each rank's forwards, in
    order; forward k of every rank together is one global batch), from the `start` buffers."""
    mean, var = list(start["running_mean"]), list(start["running_var"])
    tracked = int(start.get("num_batches_tracked", [0])[0])
    for forward in zip(*per_rank):
        n = sum(count for count, _, _ in forward)
        sums = [sum(column) for column in zip(*(s for _, s, _ in forward))]
        squares = [sum(column) for column in zip(*(q for _, _, q in forward))]
        tracked += 1
        f = momentum if momentum is not None else 1.0 / tracked
        for c, (s, q) in enumerate(zip(sums, squares)):
            batch_mean = s / n
            unbiased = (q / n - batch_mean * batch_mean) * n / max(n - 1, 1)
            mean[c] += f * (batch_mean - mean[c])
            var[c] += f * (unbiased - var[c])
    return {"running_mean": mean, "running_var": var}


def distance(found: Sequence[float], expected: Sequence[float]) -> float:
    """The largest difference of any element, relative to the expected value where that is above 1."""
    return max((abs(a - b) / max(1.0, abs(b)) for a, b in zip(found, expected)), default=0.0)
