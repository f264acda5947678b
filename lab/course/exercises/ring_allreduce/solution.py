"""Exercise `ring-allreduce`, the reference solution: all-reduce (sum, in place) from point-to-point messages
around a ring, as NCCL and Gloo's ring algorithm do it.

torchrun --standalone --nproc-per-node 3 solution.py
"""

import os
import time

import torch
import torch.distributed as dist


def chunk_bounds(numel: int, world: int) -> list[tuple[int, int]]:
    """Where each of the `world` chunks starts and ends: the first numel % world chunks one element longer,
    so any size splits (a chunk may be empty when there are fewer elements than ranks)."""
    base, extra = divmod(numel, world)
    starts = [i * base + min(i, extra) for i in range(world + 1)]
    return list(zip(starts, starts[1:]))


def exchange(outgoing: torch.Tensor, incoming: torch.Tensor, right: int, left: int) -> None:
    """Send to the right neighbour and receive from the left one, together, as one group of point-to-point
    operations. Blocking sends on every rank before any receive would each wait on a neighbour's receive; and NCCL
    runs a send and a receive that are in flight together only when they are grouped (ncclGroupStart/End, which
    batch_isend_irecv does): an isend then a recv to the same peer completes only while the chunk fits NCCL's
    buffers."""
    ops = [dist.P2POp(dist.isend, outgoing, right), dist.P2POp(dist.irecv, incoming, left)]
    for request in dist.batch_isend_irecv(ops):
        request.wait()


def ring_all_reduce(tensor: torch.Tensor) -> None:
    """Sum `tensor` over every rank, in place, like dist.all_reduce(tensor): world - 1 steps of reduce-scatter
    (after them each rank holds one chunk's full sum), then world - 1 of all-gather (each passes its sums on).
    Every rank sends 2 (world - 1) / world of the tensor, whatever the world size: the ring's bandwidth."""
    world, rank = dist.get_world_size(), dist.get_rank()
    right, left = (rank + 1) % world, (rank - 1) % world
    flat = tensor.view(-1)
    chunks = [flat[start:end] for start, end in chunk_bounds(flat.numel(), world)]

    # Reduce-scatter: at step s this rank passes on chunk (rank - s), whose partial sum it has just completed,
    # and adds its own part to chunk (rank - s - 1) arriving from the left.
    for step in range(world - 1):
        outgoing = chunks[(rank - step) % world]
        target = chunks[(rank - step - 1) % world]
        incoming = torch.empty_like(target)
        exchange(outgoing, incoming, right, left)
        target += incoming

    # All-gather: this rank now holds chunk (rank + 1)'s full sum; each step passes the newest full sum on and
    # receives the next one into place.
    for step in range(world - 1):
        outgoing = chunks[(rank + 1 - step) % world]
        exchange(outgoing, chunks[(rank - step) % world], right, left)


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
