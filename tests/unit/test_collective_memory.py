"""`lab validate` at -e 8G ran every healthy H100 node out of memory: the all-reduce correctness check held a
whole-buffer int64 index and its arithmetic beside the benchmark's own buffers (72 GiB of live tensors at 8 GiB, on
an 80 GB GPU). Measured here on the CPU, on a real one-rank gloo group, by a dispatch mode that counts the bytes of
the tensor storages alive after every op: one size of each collective, timed and checked as `lab bench collective`
does, holds at most its benchmark's own buffers plus one buffer of the message size (and its checks'
chunk-sized temporaries)."""

from __future__ import annotations

import weakref

import pytest
import torch
import torch.distributed as tdist
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from lab.measure.bench.comm import collective, collective_data, collective_perf
from lab.run.cluster.dist import DistContext

COUNT = 1 << 20  # elements of float32: 4 MiB a buffer
CHUNK = 1 << 14  # the checks' chunk here: 64 KiB of int64 temporaries, far below a buffer


class LiveBytes(TorchDispatchMode):
    """The most bytes of tensor storage alive at once while it is on: each op's outputs are counted from their
    first appearance until the last tensor on their storage is gone."""

    def __init__(self) -> None:
        super().__init__()
        self.tensors: dict[int, int] = {}  # storage address -> live tensors on it
        self.nbytes: dict[int, int] = {}
        self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                storage = t.untyped_storage()
                key = storage.data_ptr()
                self.tensors[key] = self.tensors.get(key, 0) + 1
                self.nbytes[key] = storage.nbytes()
                weakref.finalize(t, self._gone, key)
        self.peak = max(self.peak, sum(self.nbytes[k] for k, n in self.tensors.items() if n > 0))
        return out

    def _gone(self, key: int) -> None:
        self.tensors[key] -= 1


@pytest.fixture(scope="module")
def one_rank():
    store = tdist.HashStore()
    tdist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield DistContext(0, 0, 1, 1, 0, torch.device("cpu"), "gloo")
    tdist.destroy_process_group()


def _peak(body) -> int:
    with LiveBytes() as live:
        body()
    return live.peak


# sendrecv is left out: a rank cannot send to itself over gloo (its pairs connect to other ranks only); its check
# builds its data as broadcast's does, which is here
@pytest.mark.parametrize("name", [n for n in collective.NAMES if n != "sendrecv"])
def test_a_size_timed_and_checked_holds_its_buffers_and_at_most_one_more(one_rank, name, monkeypatch):
    monkeypatch.setattr(collective_data, "CHECK_CHUNK", CHUNK)
    coll = collective.COLLECTIVES[name]
    size = COUNT * 4
    count, nbytes = coll.counts(size, 4, 1)
    setup = collective_data.Setup(torch, 0, 1, one_rank.device, torch.float32, count, "sum" if coll.reduces else "none")

    def bodies_once():
        out_of_place, in_place = coll.bodies(setup)
        out_of_place()
        in_place()

    own = _peak(bodies_once)  # the benchmark's buffers: what any run of this size needs
    row = None

    def measured():
        nonlocal row
        row = collective_perf.measure(one_rank, coll, size, "float32", setup.op, iters=1, warmup=0, corrupt_rank=None)

    peak = _peak(measured)
    assert row is not None and row.oop_wrong == 0 and row.ip_wrong in (0, None)  # it checked, and found it right
    # the checks' own temporaries, a few int64 chunks, may sit on top of that one buffer: a collective's work object
    # holds its tensors until gloo's thread lets go of it, on loaded cores after the next op began (CI saw 12.4 MiB
    # here: 8 + 4 + 0.4). The defect this guards against, a whole-buffer int64 index, is 8 MiB more
    temporaries = 16 * CHUNK * 8
    assert own >= nbytes and peak <= own + nbytes + temporaries, (
        f"{name}: {peak / 2**20:.1f} MiB alive at most while measuring a {nbytes / 2**20:.0f} MiB size whose "
        f"buffers take {own / 2**20:.1f} MiB"
    )
