"""The DDP lecture's common issues, each run broken and then fixed, with the symptom measured.

`lab pitfall` lists them, `lab pitfall NAME` runs one (lab.course.pitfalls.command). The CLI imports this
module while it parses arguments, so it holds names and one-line summaries only: no torch here.
Each pitfall lives in its own module (the name with '_' for '-'): a parent side, `measure(world_size)`,
and the worker it starts under torchrun.

>>> list(PITFALLS)
['set-epoch', 'checkpoint-every-rank', 'batchnorm', 'uneven-batches', 'cuda-visible-devices']
"""

# In teaching order: the lecture's four issues, then the device-placement one that needs GPUs to show.
PITFALLS: dict[str, str] = {
    "set-epoch": "DistributedSampler without set_epoch(epoch): every epoch repeats epoch 0's order",
    "checkpoint-every-rank": "every rank saving the same file: N x the bytes, torn reads, and the 'module.' prefix",
    "batchnorm": "BatchNorm under DDP keeps per-rank running statistics: the same weights evaluate differently",
    "uneven-batches": "ranks with different batch counts: the rank with one more waits in all_reduce until timeout",
    "cuda-visible-devices": "what each process sees with and without CUDA_VISIBLE_DEVICES (GPU hosts only)",
}


def module_name(pitfall: str) -> str:
    """The module that measures `pitfall`.

    >>> module_name("checkpoint-every-rank")
    'lab.course.pitfalls.checkpoint_every_rank'
    """
    return "lab.course.pitfalls." + pitfall.replace("-", "_")
