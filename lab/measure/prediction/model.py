"""The step-time model `lab predict` uses: a data-parallel step on N ranks over M nodes, from the compute one rank
measured, the gradient bytes and their buckets, and the links' latency and bandwidth. Torch-free: pure arithmetic.

Collectives, the alpha-beta cost of each (alpha: one step's latency, B: the bus bandwidth of the slowest hop, S bytes):

    ring all-reduce      2(n-1) alpha + 2(n-1)/n S / B       (reduce-scatter then all-gather, n-1 steps each)
    tree all-reduce      2 log2(n) alpha + 2 S / B           (pipelined binary trees: up, then down)
    hierarchical         a ring reduce-scatter in each node, the nodes' all-reduce of S/g between them, an
                         all-gather in each node (g GPUs a node; Horovod's HOROVOD_HIERARCHICAL_ALLREDUCE)
    reduce-scatter, all-gather (ring)   (n-1) alpha + (n-1)/n S / B

2(n-1)/n is nccl-tests' all-reduce busbw factor (lab.measure.bench.comm.collective): with B the measured busbw, the
bandwidth term is S / algbw. Over M nodes a ring crosses each node's NICs once per direction, so B is the slower of
the node's own links and its NICs' bandwidth (all of a node's NICs together: one ring per NIC); a step's alpha is the
inter-node one as soon as M > 1. NCCL picks ring or tree per size; the model takes the faster.

Bucket pipelining (DDP): gradients become ready during the backward pass, last layer first; a bucket's all-reduce
starts when its last gradient is ready and the previous bucket's is done. With gradients ready evenly over the
backward time W, bucket i ready at W x (bytes up to i) / S:

    end_0 = ready_0 + c_0,   end_i = max(ready_i, end_(i-1)) + c_i,   exposed = max(0, end_last - W)

so when the communication is faster than the backward pass only the last bucket's all-reduce shows, and when it is
slower the excess shows as well. A step is then compute + the rest + what shows + the wrapper's own cost (DDP's
hooks and copies: measured, never hidden, the same at every N) + the ranks' spread: every collective waits for the
slowest rank, so a step of N ranks is the slowest of N step times. With each rank's step time spread by a relative
sigma, the slowest of N is E[max of N] sigma longer, E[max of N] the expected largest of N standard normal draws
(Blom's approximation: 0 at N = 1, 0.59 at 2, 1.43 at 8, 3.03 at 512). `overlap` in [0, 1] says how much of what
could hide does (1: DDP's design; a CPU whose all-reduce takes cores from the backward pass hides less: measured by `lab
predict`).

Strategies, bytes a rank moves per step for P parameters (ZeRO paper, section 7; lab.measure.sizing.choose):
    DDP          all-reduce of the gradients, bucketed, behind backward
    ZeRO-1/2     reduce-scatter of the gradients behind backward + all-gather of the updated parameters after the
                 optimizer step (exposed): the same volume as DDP
    ZeRO-3/FSDP  all-gather of the parameters in forward and again in backward + reduce-scatter of the gradients:
                 1.5x DDP; each phase hides behind its own compute except its first unit

>>> round(ring_allreduce_seconds(100e6, 8, Link(0.0, 100e9)), 6)   # 2 x 7/8 x 100 MB at 100 GB/s
0.00175
>>> exposed_seconds([1.0, 1.0, 1.0, 1.0], [1, 1, 1, 1], window=8.0)   # only the last bucket shows
1.0
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from statistics import NormalDist
from typing import Any

MIB = 2**20
FIRST_BUCKET_BYTES = 1 * MIB  # DDP's first bucket (torch.distributed's _DEFAULT_FIRST_BUCKET_BYTES), the rest the cap
BACKWARD_SHARE = 2 / 3  # backward ~ 2x forward FLOPs (6 FLOP per parameter per sample: 2 forward, 4 backward)
# A ring step's latency where nothing measured it (the validation's machines, a projection onto a platform): a round
# figure of the order NCCL's tuning model uses for a hop, a few microseconds. Stated as assumed wherever used.
ASSUMED_INTRA_LATENCY_SECONDS = 2e-6
ASSUMED_INTER_LATENCY_SECONDS = 5e-6
STRATEGIES = ("ddp", "zero1", "zero2", "zero3", "fsdp")


@dataclass(frozen=True)
class Link:
    """One kind of hop: latency per ring step (seconds) and bus bandwidth (bytes/s)."""

    latency_seconds: float
    bus_bytes_per_second: float


@dataclass(frozen=True)
class Assumption:
    """A number the prediction uses and where it came from: measured here, a platform table, published, given by
    the user, or assumed (a stated default)."""

    name: str
    value: float
    unit: str
    source: str

    def line(self) -> str:
        return f"{self.name} = {self.value:.4g} {self.unit}  ({self.source})"


@dataclass(frozen=True)
class Inputs:
    """Everything one prediction needs, each number one rank's."""

    compute_seconds: float  # forward + backward of one rank's batch, alone
    other_seconds: float  # optimizer and the rest of a step, not overlapped
    gradient_bytes: float  # bytes all-reduced per step (parameters x bytes per gradient)
    samples_per_rank: int
    bucket_bytes: float = 25 * MIB  # dist.bucket_cap_mb
    intra: Link = Link(1e-6, 100e9)  # within a node
    inter: Link | None = None  # between nodes (None: one node only)
    gpus_per_node: int = 8
    overlap: float = 1.0  # of the communication that could hide behind backward, the part that does
    # The data-parallel wrapper's own cost a step, beyond its collectives (DDP's hooks, the copies into buckets,
    # each collective's launch): never hidden, the same at every N; measured where the wrapper runs (lab predict: the
    # K-rank step less the model's parts; --validate: the published 1-GPU DDP step less the same GPU without DDP).
    wrapper_seconds: float = 0.0
    wrapped_from: int = 2  # the smallest world size run under the wrapper (1 where a 1-GPU DDP run was measured)
    backward_share: float = BACKWARD_SHARE
    cores: int | None = None  # CPU ranks: processors on the node (ranks beyond them share), None: a device each
    threads_per_rank: int = 1
    strategy: str = "ddp"
    hierarchical: bool = False  # across nodes: reduce-scatter in the node, all-reduce between nodes, all-gather
    spread: float = 0.0  # the ranks' step times' relative spread (sigma): the slowest of N sets the pace
    assumptions: tuple[Assumption, ...] = field(default_factory=tuple)


def ring_allreduce_seconds(nbytes: float, n: int, link: Link) -> float:
    if n <= 1:
        return 0.0
    return 2 * (n - 1) * link.latency_seconds + 2 * (n - 1) / n * nbytes / link.bus_bytes_per_second


def tree_allreduce_seconds(nbytes: float, n: int, link: Link) -> float:
    if n <= 1:
        return 0.0
    return 2 * math.ceil(math.log2(n)) * link.latency_seconds + 2 * nbytes / link.bus_bytes_per_second


def ring_half_seconds(nbytes: float, n: int, link: Link) -> float:
    """A ring reduce-scatter or all-gather of `nbytes` in all (each rank holds nbytes / n)."""
    if n <= 1:
        return 0.0
    return (n - 1) * link.latency_seconds + (n - 1) / n * nbytes / link.bus_bytes_per_second


def allreduce_seconds(nbytes: float, n: int, link: Link) -> float:
    """The faster of ring and tree, as NCCL's tuner picks per size."""
    return min(ring_allreduce_seconds(nbytes, n, link), tree_allreduce_seconds(nbytes, n, link))


def hierarchical_allreduce_seconds(nbytes: float, n: int, inputs: Inputs) -> float:
    """Over several nodes, in three phases: a reduce-scatter within each node, an all-reduce of each GPU's 1/g share
    between the nodes, an all-gather within each node (g GPUs a node).

    >>> nodes = Inputs(1.0, 0.0, 8e9, 1, intra=Link(0.0, 100e9), inter=Link(0.0, 10e9), gpus_per_node=8)
    >>> round(hierarchical_allreduce_seconds(8e9, 16, nodes), 4)   # 2 x 7/8 x 80 ms in the nodes, 1 GB over 2 nodes
    0.24
    """
    g = min(n, inputs.gpus_per_node)
    if n <= g or inputs.inter is None:
        return allreduce_seconds(nbytes, n, inputs.intra)
    nodes = math.ceil(n / g)
    within = 2 * ring_half_seconds(nbytes, g, inputs.intra)
    between = allreduce_seconds(nbytes / g, nodes, inputs.inter)
    return within + between


def expected_slowest(n: int) -> float:
    """E[max of n standard normal draws], Blom's approximation: how many sigmas the slowest of n ranks is behind.

    >>> [round(expected_slowest(n), 2) for n in (1, 2, 8, 512)]
    [0.0, 0.59, 1.43, 3.03]
    """
    if n <= 1:
        return 0.0
    return NormalDist().inv_cdf((n - 0.375) / (n + 0.25))


def path(inputs: Inputs, n: int) -> Link:
    """The link a collective over n ranks is limited by: the node's own while it fits a node, else the slower of the
    node's links and its NICs, with the inter-node latency."""
    if n <= inputs.gpus_per_node or inputs.inter is None:
        return inputs.intra
    return Link(
        max(inputs.intra.latency_seconds, inputs.inter.latency_seconds),
        min(inputs.intra.bus_bytes_per_second, inputs.inter.bus_bytes_per_second),
    )


def buckets(gradient_bytes: float, cap_bytes: float) -> list[float]:
    """DDP's buckets in the order they are reduced: a first small one, then the cap, the remainder last.

    >>> buckets(3 * MIB, 1 * MIB) == [MIB, MIB, MIB]
    True
    >>> [round(b / MIB, 1) for b in buckets(60 * MIB, 25 * MIB)]
    [1.0, 25.0, 25.0, 9.0]
    """
    sizes, left = [], float(gradient_bytes)
    first = min(FIRST_BUCKET_BYTES, cap_bytes, left)
    if first > 0:
        sizes.append(first)
        left -= first
    while left > 1e-9:
        sizes.append(min(cap_bytes, left))
        left -= sizes[-1]
    return sizes


def exposed_seconds(bucket_seconds: list[float], bucket_bytes: list[float], window: float) -> float:
    """What of the buckets' communication outlasts a backward pass of `window` seconds (module docstring).

    >>> exposed_seconds([1.0, 1.0, 1.0, 1.0], [1, 1, 1, 1], window=2.0)   # ready at .5, 1, 1.5, 2: ends at 4.5
    2.5
    """
    total = sum(bucket_bytes)
    if not bucket_seconds or total <= 0:
        return 0.0
    done, ready_bytes = 0.0, 0.0
    for seconds, nbytes in zip(bucket_seconds, bucket_bytes, strict=True):
        ready_bytes += nbytes
        done = max(window * ready_bytes / total, done) + seconds
    return max(0.0, done - window)


def _hidden(total: float, pipelined: float, overlap: float) -> float:
    """Exposed seconds: the pipeline's, plus what imperfect overlap fails to hide of the rest."""
    return pipelined + (1.0 - overlap) * max(0.0, total - pipelined)


def compute_slowdown(inputs: Inputs, n: int) -> float:
    """Ranks of one node beyond its processors take turns: compute per rank grows with them (1 on GPUs)."""
    if inputs.cores is None:
        return 1.0
    per_node = min(n, inputs.gpus_per_node)
    return max(1.0, per_node * inputs.threads_per_rank / inputs.cores)


def predict(inputs: Inputs, n: int) -> dict[str, Any]:
    """One step on n ranks: its parts, its time, throughput and (weak scaling) efficiency against one rank."""
    slow = compute_slowdown(inputs, n)
    compute, other = inputs.compute_seconds * slow, inputs.other_seconds * slow
    window = compute * inputs.backward_share
    forward = compute - window
    link = path(inputs, n)
    grads = inputs.gradient_bytes
    if inputs.strategy == "ddp":
        sizes = buckets(grads, inputs.bucket_bytes)
        if inputs.hierarchical:
            times = [hierarchical_allreduce_seconds(b, n, inputs) for b in sizes]
        else:
            times = [allreduce_seconds(b, n, link) for b in sizes]
        total = sum(times)
        exposed = _hidden(total, exposed_seconds(times, sizes, window), inputs.overlap)
    elif inputs.strategy in ("zero1", "zero2"):
        sizes = buckets(grads, inputs.bucket_bytes)
        times = [ring_half_seconds(b, n, link) for b in sizes]
        gather = ring_half_seconds(grads, n, link)  # the updated parameters, after the optimizer step
        total = sum(times) + gather
        exposed = _hidden(sum(times), exposed_seconds(times, sizes, window), inputs.overlap) + gather
    else:  # zero3, fsdp: parameters gathered for forward and again for backward, gradients reduce-scattered
        sizes = buckets(grads, inputs.bucket_bytes)
        gathers = [ring_half_seconds(b, n, link) for b in sizes]
        scatters = list(gathers)
        total = 2 * sum(gathers) + sum(scatters)
        forward_exposed = _hidden(sum(gathers), exposed_seconds(gathers, sizes, forward), inputs.overlap)
        backward_times = [g + s for g, s in zip(gathers, scatters, strict=True)]
        backward_exposed = _hidden(sum(backward_times), exposed_seconds(backward_times, sizes, window), inputs.overlap)
        exposed = forward_exposed + backward_exposed
    wrapper = inputs.wrapper_seconds if n >= inputs.wrapped_from else 0.0
    slowest = (compute + other) * inputs.spread * expected_slowest(n)  # every collective waits for the last rank
    step = compute + other + exposed + wrapper + slowest
    alone = inputs.compute_seconds + inputs.other_seconds
    return {
        "world_size": n,
        "nodes": math.ceil(n / inputs.gpus_per_node),
        "strategy": inputs.strategy,
        "compute_seconds": compute,
        "other_seconds": other,
        "communication_seconds": total,
        "exposed_communication_seconds": exposed,
        "wrapper_seconds": wrapper,
        "slowest_rank_seconds": slowest,
        "step_seconds": step,
        "samples_per_second": n * inputs.samples_per_rank / step,
        "efficiency": alone / step,
        "buckets": len(sizes),
    }


def with_strategy(inputs: Inputs, strategy: str) -> Inputs:
    return replace(inputs, strategy=strategy)
