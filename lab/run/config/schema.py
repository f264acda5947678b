"""The configuration's schema: one frozen dataclass a section, each field declared once with its default, its
documentation and its range (`knob`), which drive validation, "did you mean" and `lab train --help-config`.
Loading and checking a config from YAML and `--set` is lab.run.config's.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from lab.run.config import strategies

# PyTorch's SyncBatchNorm.forward drops empty ranks' statistics with a boolean mask (torch 2.14
# torch/nn/modules/_functions.py, line 97-98: `mask = count_all.squeeze(-1) >= 1; count_all = count_all[mask]`):
# a result whose shape depends on device values, so the host waits for the GPU there, in every layer of every step.
SYNC_BATCHNORM_WAITS = (
    "the host waits for the GPU in every BatchNorm layer of every step (PyTorch's SyncBatchNorm "
    "indexes with a boolean mask), so the step loop no longer runs ahead of the device"
)


def knob(
    default: Any,
    help: str,
    *,
    min: float | None = None,
    max: float | None = None,
    choices: Callable[[], dict[str, str]] | None = None,
) -> Any:
    """A config field with its documentation and range, declared in one place. `choices`, for a text field whose
    values a table holds, gives the allowed values with a line each, read when a value is checked."""
    return field(default=default, metadata={"help": help, "min": min, "max": max, "choices": choices})


@dataclass(frozen=True)
class RunConfig:
    name: str = knob("train", "Label for the run; the run id starts with a time stamp and ends with it.")
    id: str = knob(
        "",
        "Run id; empty: under torchrun <name>-<rendezvous id> (stable across restarts), else a new "
        "time-stamped id. Reusing an id (with checkpoint.resume=auto) resumes that run.",
    )
    output_dir: str = knob("runs", "Directory that holds one sub-directory per run.")
    seed: int = knob(0, "Seed for model initialisation, data order and augmentation.", min=0)
    deterministic: bool = knob(False, "Deterministic kernels: two CPU runs with one seed give bit-identical losses.")


@dataclass(frozen=True)
class DataConfig:
    source: Literal["auto", "cifar10", "synthetic"] = knob(
        "auto", "auto: real CIFAR-10 when found under data.root, else synthetic CIFAR-shaped data."
    )
    root: str = knob("data", "Directory holding cifar-10-batches-py/ (torchvision layout).")
    synthetic_train_size: int = knob(50000, "Training images generated when the source is synthetic.", min=1)
    synthetic_test_size: int = knob(10000, "Test images generated when the source is synthetic.", min=1)
    synthetic_seed: int = knob(0, "Seed of the synthetic data set (independent of run.seed).", min=0)
    augment: bool = knob(True, "Random crop (4-pixel zero padding) and horizontal flip, batched on the device.")
    shuffle: bool = knob(True, "A new sample order every epoch (DistributedSampler semantics).")
    uneven: Literal["pad", "drop", "join"] = knob(
        "pad",
        "When samples do not split evenly over ranks: pad with repeats, drop the tail, "
        "or join (no padding; DDP's Join context covers ranks that run out first).",
    )
    eval_batch_size_per_rank: int = knob(500, "Batch size per rank for evaluation.", min=1)


@dataclass(frozen=True)
class ModelConfig:
    arch: Literal["resnet18"] = knob(
        "resnet18", "torchvision ResNet-18 with a 3x3 stem and no max-pool for 32x32 inputs."
    )
    width: int = knob(64, "Base channel count (64 is ResNet-18; 8-16 make fast test models).", min=1)
    norm: Literal["batch", "group"] = knob("batch", "Normalisation layer: batch (BatchNorm) or group (GroupNorm).")
    sync_batchnorm: bool = knob(
        False,
        "Convert BatchNorm to SyncBatchNorm (CUDA only, as in PyTorch). "
        + f"Not with data.uneven=join. On CUDA {SYNC_BATCHNORM_WAITS}.",
    )
    zero_init_residual: bool = knob(
        False,
        "Start each residual block's last norm at zero, so every block starts as the identity (large-batch "
        "training's start, Goyal et al. 2017).",
    )
    channels_last: bool = knob(False, "NHWC memory format for model and inputs (faster convolutions on GPUs).")
    compile: bool = knob(False, "torch.compile the model (first steps are slow while it compiles).")
    dtype: Literal["float32", "float64"] = knob(
        "float32", "Parameter dtype. float64 exists for numerical-equivalence tests, not for training."
    )


@dataclass(frozen=True)
class TrainConfig:
    epochs: int = knob(1, "Passes over the training set.", min=1)
    max_steps: int = knob(
        0, "Stop after this many optimizer steps (0: epochs decide); the schedule spans the steps run.", min=0
    )
    stop_after_steps: int = knob(
        0, "Checkpoint and stop after this many steps without shortening the schedule, to show resume (0: off).", min=0
    )
    global_batch_size: int = knob(
        256, "Samples per optimizer step summed over all ranks and accumulation steps.", min=1
    )
    grad_accum_steps: int = knob(1, "Micro-batches per optimizer step; DDP syncs only on the last (no_sync).", min=1)
    lr: float = knob(0.2, "Peak learning rate for the global batch.", min=0.0)
    momentum: float = knob(0.9, "SGD momentum.", min=0.0, max=1.0)
    nesterov: bool = knob(True, "Nesterov momentum.")
    weight_decay: float = knob(
        5e-4, "Weight decay on convolution and linear weights (not on norms and biases).", min=0.0
    )
    label_smoothing: float = knob(0.0, "Label smoothing of the cross-entropy loss.", min=0.0, max=1.0)
    schedule: Literal["cosine", "onecycle", "constant"] = knob(
        "cosine", "Learning-rate schedule after warm-up: cosine to zero, one-cycle, or constant."
    )
    warmup_steps: int = knob(
        0, "Linear warm-up steps (cosine and constant; one-cycle uses them as its rising phase).", min=0
    )
    amp: Literal["auto", "off", "bf16", "fp16"] = knob(
        "auto", "Mixed precision: auto is bf16 on GPUs that support it and off elsewhere; fp16 adds a GradScaler."
    )
    log_every: int = knob(20, "Optimizer steps between log rows (the only host syncs of the step loop).", min=1)
    profile_steps: int = knob(
        0,
        "Record a torch.profiler trace of this many steps after 3 warm-up steps into the "
        "run directory (trace-rank<r>.json, Chrome/Perfetto); 0: off.",
        min=0,
    )


@dataclass(frozen=True)
class DistConfig:
    strategy: str = knob(
        strategies.DEFAULT,
        "How the model is wrapped, stepped and saved across ranks (lab/run/training/strategies/).",
        choices=strategies.names,
    )
    zero_stage: int = knob(
        2,
        "DeepSpeed ZeRO stage with dist.strategy=deepspeed: 1 shards optimizer state, 2 also "
        "gradients, 3 also parameters.",
        min=1,
        max=3,
    )
    device: Literal["auto", "cpu", "cuda"] = knob(
        "auto", "auto: one CUDA device per process when present, else the CPU."
    )
    backend: Literal["auto", "nccl", "gloo"] = knob("auto", "auto: nccl on CUDA, gloo on the CPU.")
    timeout_seconds: float = knob(
        300.0,
        "Process-group timeout: a collective that waits longer fails the run (above dist.hang_seconds, below "
        "the job's own limit: docs/reliability.md).",
        min=1.0,
    )
    hang_seconds: float = knob(
        30.0,
        "A rank whose main thread has not moved this long writes what its collectives were and asks the others "
        "for theirs; the first to ask prints which rank waits in which collective, on which line (hang.json). "
        "At most half of dist.timeout_seconds is used, so it speaks while the collective still waits; 0: none.",
        min=0.0,
    )
    bucket_cap_mb: float = knob(25.0, "DDP gradient bucket size in MiB.", min=0.0)
    gradient_as_bucket_view: bool = knob(True, "Gradients alias DDP's buckets (saves one copy and memory).")
    static_graph: bool = knob(
        False,
        "DDP static_graph (the same parameters are used every step); not with "
        "gradient accumulation (DDP's no_sync asserts with it, PyTorch issue 143580).",
    )
    single_process_group: bool = knob(
        False,
        "Build a process group (and wrap the model in DDP) even at world "
        "size 1: the device check's way through NCCL, DDP and compile's "
        "DDPOptimizer on one GPU.",
    )
    broadcast_buffers: bool = knob(
        False,
        "Broadcast buffers (BatchNorm running stats) from rank 0 before every "
        "forward; off because evaluation broadcasts them once, where they matter.",
    )
    horovod_timeline_steps: int = knob(
        10,
        "With dist.strategy=horovod: record Horovod's timeline (each tensor's "
        "negotiation, fusion-buffer copies and all-reduce) over the first this "
        "many optimizer steps into the run directory's horovod-timeline.json; "
        "0: none.",
        min=0,
    )


@dataclass(frozen=True)
class CheckpointConfig:
    every_steps: int = knob(0, "Write runs/<id>/checkpoints/last.pt every this many steps (0: only at the end).", min=0)
    dir: str = knob(
        "",
        "Folder for checkpoints, one sub-folder per run id (<dir>/<id>/last.pt); empty: the run "
        "directory's checkpoints/. On a file system every node shares, a restart whose rank 0 "
        "lands on another node resumes instead of starting over.",
    )
    resume: str = knob("auto", "auto: resume from this run id's last.pt when it exists; never; or a checkpoint path.")
    save: bool = knob(True, "Write checkpoints at all.")


@dataclass(frozen=True)
class MetricsConfig:
    port_base: int = knob(
        0, "Each rank serves Prometheus /metrics on port_base + local_rank (0: no exporter).", min=0, max=65535
    )
    bind_address: str = knob(
        "127.0.0.1",
        "Address the exporters listen on; 0.0.0.0 to be scraped from other hosts. "
        "On a multi-node run loopback becomes 0.0.0.0, and the file_sd targets "
        "name the node's address (multinode.yml passes lab_node_address).",
    )
    pushgateway: str = knob("", "host:port of a Prometheus Pushgateway for the run summary (empty: no push).")
    targets_dir: str = knob(
        "",
        "Also write the run's Prometheus file_sd target file here (a directory Prometheus "
        "globs); empty: only runs/<id>/prometheus-targets.json.",
    )
    job: str = knob("lab", "The job label of pushed summaries.")


@dataclass(frozen=True)
class Config:
    run: RunConfig = field(default_factory=RunConfig)
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    dist: DistConfig = field(default_factory=DistConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    # Where the values came from, for error messages; not a config key.
    origin: str = field(default="<defaults>", compare=False, repr=False)


# Each section's default_factory is its dataclass (the field's type), which dataclasses types as a bare factory.
SECTIONS: dict[str, type] = {
    f.name: typing.cast(type, f.default_factory) for f in dataclasses.fields(Config) if f.name != "origin"
}
