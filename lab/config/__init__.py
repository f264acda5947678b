"""Configuration: YAML files and `--set` overrides into frozen, validated dataclasses.

Precedence, lowest first: the defaults declared below, then the YAML file, then
each `--set section.key=value` in order. Every field is documented where it is
declared; `lab train --help-config` prints them.

>>> cfg = load(None, ["train.global_batch_size=64", "model.width=16"])
>>> cfg.train.global_batch_size, cfg.model.width, cfg.model.norm
(64, 16, 'batch')
>>> load(None, ["train.global_batch_size=-4"])
Traceback (most recent call last):
...
lab.errors.ConfigError: --set train.global_batch_size: -4 is out of range; expected an integer >= 1

Rules between fields live in lab.config.rules: those that need the world size (the global batch must split
evenly over ranks and accumulation steps) are checked by `check_layout` once it is known. dist.strategy takes
the names of the strategy table, lab.config.strategies.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import re
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from lab.config import rules, strategies
from lab.config.rules import batch_size_per_rank, check_layout
from lab.errors import ConfigError

__all__ = [
    "Config",
    "batch_size_per_rank",
    "check_layout",
    "describe",
    "from_dict",
    "host_sync_warning",
    "load",
    "to_dict",
    "with_overrides",
]

_SCIENTIFIC = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")

SHIPPED_DIR = Path(__file__).parent / "presets"


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
        "How the model is wrapped, stepped and saved across ranks (lab/training/strategies/).",
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
        600.0, "Process-group timeout: a collective that waits longer fails the run.", min=1.0
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


# ----------------------------------------------------------------------------- loading


def resolve_path(name_or_path: str) -> Path:
    """A config path as given, or the name of a shipped config (`smoke`, `ddp`, ...)."""
    path = Path(name_or_path)
    if path.exists() or path.suffix in (".yaml", ".yml") or "/" in name_or_path:
        return path
    shipped = SHIPPED_DIR / f"{name_or_path}.yaml"
    return shipped if shipped.exists() else path


def shipped_names() -> list[str]:
    return sorted(p.stem for p in SHIPPED_DIR.glob("*.yaml"))


def load(path: str | Path | None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Defaults, then the YAML file at `path` (if any), then `overrides` ("a.b=v")."""
    values: dict[str, dict[str, Any]] = {name: {} for name in SECTIONS}
    origin = "<defaults>"
    if path is not None:
        resolved = resolve_path(str(path))
        origin = str(resolved)
        for section, key, value in _read_yaml(resolved):
            values[section][key] = _check(origin, section, key, value)
    for item in overrides:
        section, key, value = _parse_override(item)
        values[section][key] = _check(f"--set {section}.{key}", section, key, value)
    sections = {name: cls(**values[name]) for name, cls in SECTIONS.items()}
    cfg = Config(**sections, origin=origin)
    rules.check(cfg, strategies.STRATEGIES)
    return cfg


def _read_yaml(path: Path):
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(
            f"{path}: config file not found; give a path or one of: {', '.join(shipped_names())}"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read config: {exc}") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{path}: {where}invalid YAML ({problem})") from None
    if doc is None:
        return
    if not isinstance(doc, dict):
        raise ConfigError(f"{path}: top level must be a mapping of sections ({', '.join(SECTIONS)}), got {_kind(doc)}")
    for section, body in doc.items():
        _known(f"{path}: {section}", str(section), list(SECTIONS), "sections")
        if body is None:
            continue
        if not isinstance(body, dict):
            raise ConfigError(f"{path}: {section}: must be a mapping of keys, got {_kind(body)}")
        for key, value in body.items():
            yield section, str(key), value


def _parse_override(item: str) -> tuple[str, str, Any]:
    name, sep, raw = item.partition("=")
    name = name.strip()
    if not sep or "." not in name:
        raise ConfigError(f"--set {item}: expected section.key=value, for example --set train.lr=0.1")
    section, _, key = name.partition(".")
    _known(f"--set {name}", section, list(SECTIONS), "sections")
    _field(f"--set {name}", section, key)
    hint = _hint(section, key)
    # Text fields take the raw text, so `--set run.id=0042` stays a string.
    if hint is str or typing.get_origin(hint) is Literal:
        return section, key, raw
    try:
        return section, key, yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        return section, key, raw


def _field(where: str, section: str, key: str) -> dataclasses.Field:
    fields = {f.name: f for f in dataclasses.fields(SECTIONS[section])}
    _known(where, key, list(fields), f"keys in {section}")
    return fields[key]


def _known(where: str, name: str, valid: list[str], what: str) -> None:
    """Raise unless `name` is one of `valid`; suggest the closest valid name."""
    if name in valid:
        return
    close = difflib.get_close_matches(name, valid, n=1)
    hint = f"did you mean {close[0]}? " if close else ""
    raise ConfigError(f"{where}: unknown key; {hint}valid {what}: {', '.join(valid)}")


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    # Field types are strings under `from __future__ import annotations`; this module's names resolve them.
    return typing.get_type_hints(cls)


def _hint(section: str, key: str) -> Any:
    return _hints(SECTIONS[section])[key]


def _check(origin: str, section: str, key: str, value: Any) -> Any:
    """Return `value` converted to the field's type, or raise a ConfigError saying what is valid."""
    where = origin if origin.startswith("--set") else f"{origin}: {section}.{key}"
    fld = _field(where, section, key)
    hint = _hint(section, key)
    lo, hi = fld.metadata.get("min"), fld.metadata.get("max")
    table = fld.metadata.get("choices")
    if typing.get_origin(hint) is Literal or table:
        choices = list(table()) if table else typing.get_args(hint)
        if value not in choices:
            raise ConfigError(f"{where}: {value!r} is not allowed; expected one of {', '.join(map(str, choices))}")
        return value
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true or false, got {_show(value)}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer{_range(lo, hi)}, got {_show(value)}")
    elif hint is float:
        if isinstance(value, str) and _SCIENTIFIC.fullmatch(value.strip()):
            value = float(value)  # YAML 1.1 (PyYAML) reads 5e-4 as text: it wants 5.0e-4
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: expected a number{_range(lo, hi)}, got {_show(value)}")
        value = float(value)
        if value != value or value in (float("inf"), float("-inf")):
            raise ConfigError(f"{where}: expected a finite number{_range(lo, hi)}, got {value}")
    elif hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {_show(value)}")
        return value
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        noun = "an integer" if hint is int else "a number"
        raise ConfigError(f"{where}: {value} is out of range; expected {noun}{_range(lo, hi)}")
    return value


def _range(lo: float | None, hi: float | None) -> str:
    if lo is not None and hi is not None:
        return f" in [{lo:g}, {hi:g}]"
    if lo is not None:
        return f" >= {lo:g}"
    return f" <= {hi:g}" if hi is not None else ""


def _show(value: Any) -> str:
    return f"{_kind(value)} {value!r}" if not isinstance(value, (dict, list)) else _kind(value)


def _kind(value: Any) -> str:
    return {dict: "a mapping", list: "a list", str: "text", bool: "a boolean", type(None): "nothing"}.get(
        type(value), type(value).__name__
    )


# ----------------------------------------------------------------------------- warnings


def host_sync_warning(cfg: Config, device) -> str | None:
    """The start-of-run line for a run whose step loop waits for the device (SyncBatchNorm on CUDA), or None.

    >>> import types
    >>> cfg = with_overrides(load(None), model={"sync_batchnorm": True})
    >>> host_sync_warning(cfg, types.SimpleNamespace(type="cpu")) is None
    True
    """
    if not (cfg.model.sync_batchnorm and getattr(device, "type", device) == "cuda"):
        return None
    return f"model.sync_batchnorm=true on CUDA: {SYNC_BATCHNORM_WAITS}"


# ----------------------------------------------------------------------------- output


def to_dict(cfg: Config) -> dict[str, dict[str, Any]]:
    return {name: dataclasses.asdict(getattr(cfg, name)) for name in SECTIONS}


def from_dict(values: dict[str, dict[str, Any]], origin: str) -> Config:
    """A config that `load` already checked, back from `to_dict`'s form (a run's resolved file, which its parent
    wrote after every check): nothing is checked again.

    >>> cfg = load("smoke")
    >>> from_dict(to_dict(cfg), cfg.origin) == cfg
    True
    """
    return Config(**{name: cls(**values[name]) for name, cls in SECTIONS.items()}, origin=origin)


def describe() -> str:
    """Every key with its default and documentation, for `--help-config`."""
    lines = []
    for name, cls in SECTIONS.items():
        lines.append(f"{name}:")
        for f in dataclasses.fields(cls):
            value = yaml.safe_dump(f.default, default_flow_style=True).strip().removesuffix("...").strip()
            table = f.metadata["choices"]
            allowed = f" One of: {'; '.join(f'{n} ({says})' for n, says in table().items())}." if table else ""
            lines.append(f"  {f.name}: {value}  # {f.metadata['help']}{allowed}")
    return "\n".join(lines)


def with_overrides(cfg: Config, **sections: dict[str, Any]) -> Config:
    """A copy of `cfg` with some keys replaced, e.g. with_overrides(cfg, run={"id": "x"})."""
    replaced = {name: dataclasses.replace(getattr(cfg, name), **values) for name, values in sections.items()}
    return dataclasses.replace(cfg, **replaced)
