"""Exercise `ring-allreduce`: write all-reduce yourself, from point-to-point messages around a ring.

dist.all_reduce(tensor) leaves on every rank the sum of every rank's tensor. NCCL and Gloo do it (for large
tensors) as a ring: rank r sends only to rank r + 1 and receives only from rank r - 1, the tensor cut in
world_size chunks. First a reduce-scatter: world_size - 1 steps, each passing one chunk to the right and adding
the chunk that arrives from the left into this rank's own, until every rank holds one chunk's full sum. Then an
all-gather: world_size - 1 steps passing those full sums on round the ring. Each rank sends 2 (n - 1) / n of the
tensor in all, whatever the world size n: that is why the ring scales.

Write ring_all_reduce below with point-to-point operations only (dist.batch_isend_irecv; or dist.send /
dist.recv), then try it:

    torchrun --standalone --nproc-per-node 3 exercises/ring_allreduce.py

and check it: `lab exercise check ring-allreduce`. The check calls your ring_all_reduce itself
on 2, 3 and 4 ranks, with tensors of its own (sizes that do not divide by the world size among them), compares
each result with dist.all_reduce's, records which torch.distributed calls yours made, and times it beside the
library's.
"""

import os
import time

import torch
import torch.distributed as dist


def ring_all_reduce(tensor: torch.Tensor) -> None:
    """Sum `tensor` over every rank, in place, like dist.all_reduce(tensor) (its default op, SUM)."""
    # TODO(ring): world, rank = dist.get_world_size(), dist.get_rank(); split tensor.view(-1) into `world`
    # chunks that cover every element, whatever its size: the first numel % world chunks one element longer (a
    # chunk may be empty when there are fewer elements than ranks). Views into it (flat[start:end]) let you
    # write the sums in place.
    # TODO(ring): your neighbours: send to the right, (rank + 1) % world; receive from the left, (rank - 1) % world.
    # Each step sends and receives together, as one group: dist.batch_isend_irecv([dist.P2POp(dist.isend, chunk,
    # right), dist.P2POp(dist.irecv, buffer, left)]), then .wait() on each request it returns. (A blocking
    # dist.send on every rank before any receive leaves each waiting on the next; and NCCL runs a send and a
    # receive in flight together only when they are grouped like this.)
    # TODO(ring): reduce-scatter, world - 1 steps: at step s send chunk (rank - s) % world, receive chunk
    # (rank - s - 1) % world's partial sum and add it into yours. After the last step this rank holds the full sum
    # of chunk (rank + 1) % world.
    # TODO(ring): all-gather, world - 1 steps: at step s send chunk (rank + 1 - s) % world, receive chunk
    # (rank - s) % world (a full sum now) straight into place.
    raise NotImplementedError("ring_all_reduce: do the TODO(ring) steps")


def main() -> None:
    """Your own try, before the check: each size against dist.all_reduce, and the time of one call."""
    local_rank = int(os.environ["LOCAL_RANK"])
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
    dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")
    device = torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")
    rank = dist.get_rank()
    torch.manual_seed(rank)  # each rank its own numbers, so a sum that skipped a rank shows
    for numel in (1, 7, 1000, 4099, 1 << 20):
        mine = torch.randn(numel).to(device)
        expected = mine.clone()
        dist.all_reduce(expected)
        dist.barrier()
        started = time.perf_counter()
        ring_all_reduce(mine)
        if device.type == "cuda":
            torch.cuda.synchronize()
        milliseconds = (time.perf_counter() - started) * 1e3
        verdict = "equals" if torch.allclose(mine, expected, rtol=1e-5, atol=1e-5) else "DIFFERS FROM"
        if rank == 0:
            print(f"{numel:>8} floats: {verdict} dist.all_reduce ({milliseconds:.2f} ms)")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
