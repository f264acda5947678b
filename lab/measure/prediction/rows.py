"""Scaling figures as rows in a file (published ones, or your own cluster's), each predicted by the step-time model
and compared with its figure: `lab predict --rows FILE`. The shipped tables are such files
(lab/measure/prediction/tables/*.yaml), and docs/prediction.md documents the format:

    table: PyTorch DDP, 25 MB buckets                      # what the figures are
    source: pytorch/pytorch benchmarks/distributed/ddp/README.md
    defaults:                                              # what every row takes unless it says otherwise
      model: {parameters: 25.6e6, step_seconds: 0.097, samples_per_gpu: 32}
      hardware: {gpus_per_node: 8, node_gbytes: 150, nics_per_node: 4, nic_gbits: 100, fabric: infiniband}
    rows:
      - row: resnet50, 8 GPUs
        hardware: {gpus: 8}
        published: {step_seconds: 0.104}

A row's keys are its own, else its file's defaults, else KEYS' defaults (model.parameters, model.step_seconds,
hardware.gpus and a published figure have none). What a row cannot say is taken from a stated constant, and every
constant a prediction uses is printed with its source: published (the row's own figures), measured (a `lab
validate` run's, with --calibration), or assumed (FABRICS, WRAPPER_SHARE, SPREAD).

>>> row = parse({"row": "r", "model": {"parameters": 25e6, "step_seconds": 0.1, "samples_per_gpu": 32},
...              "hardware": {"gpus": 8}, "published": {"step_seconds": 0.11}}, {}, "demo.yaml", 0)
>>> round(predict(row)["predicted"], 4), predict(row)["side"]
(0.1115, 'pessimistic')
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from lab.errors import LabError
from lab.measure.prediction import model
from lab.measure.prediction.model import Assumption, Link

TABLES = Path(__file__).with_name("tables")  # the shipped rows

# A fabric's bus bandwidth over its NICs' line rate, and a ring step's latency across it. InfiniBand's efficiency is
# lab.measure.platforms' (a healthy fabric's busbw / the NICs' line rate, cited there); the rest is assumed, said
# so wherever used: RoCE a few points below InfiniBand (congestion control over lossless Ethernet), TCP well below
# (NCCL's socket transport: copies through the kernel, no RDMA), each with a longer step.
FABRICS: dict[str, tuple[float, float, str]] = {
    "infiniband": (0.94, 5e-6, "lab.measure.platforms (efficiency, cited); the latency assumed"),
    "roce": (0.88, 8e-6, "assumed: InfiniBand's efficiency less RoCE's congestion control"),
    "tcp": (0.70, 25e-6, "assumed: NCCL's socket transport, no RDMA"),
}
# The data-parallel wrapper's own cost a step, where a row gives no 1-GPU run under it: the median over PyTorch's
# DDP benchmark (lab/measure/prediction/tables/pytorch-ddp-25mb.yaml) of its 2-GPU step over the same GPU's step
# without DDP, less 1 (ResNet-50 6.2%, ResNet-101 8.6%, ResNeXt-50 5.5%, ResNeXt-101 5.5%): a share of the step.
WRAPPER_SHARE = 0.059
# The ranks' step times' relative spread (lab.measure.prediction.model: the slowest of N sets the pace). Fitted on
# the shipped rows' fitting half (fit(), docs/prediction.md), then held to the other half.
SPREAD = 0.0375
SPLIT_SEED = 0  # the shipped rows' split into a fitting half and a held-out half (halves())
INTRA_LATENCY_SECONDS = model.ASSUMED_INTRA_LATENCY_SECONDS
BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}
BUCKETINGS = ("ddp", "one-bucket", "per-tensor")
ROLES = ("check", "input", "cited")
TEXT_KEYS = ("model.precision", "hardware.fabric", "published.against")

# key: (default, what it is) -- None: the row must give it
KEYS: dict[str, tuple[Any, str]] = {
    "model.parameters": (None, "parameter count, e.g. 25.6e6"),
    "model.precision": ("fp32", "fp32, fp16 or bf16: the gradients' bytes (the step time is given at it)"),
    "model.bytes_per_gradient": (None, "bytes a gradient element takes (default: 4 for fp32, 2 for fp16 or bf16)"),
    "model.step_seconds": (None, "one GPU's whole step at samples_per_gpu without the wrapper, in seconds"),
    "model.wrapped_step_seconds": (None, "the same step under the wrapper on one GPU (its own cost read from it)"),
    "model.samples_per_gpu": (32, "samples a GPU takes a step"),
    "model.tensors": (None, "parameter tensors (for per-tensor all-reduce)"),
    "hardware.gpus": (None, "the GPUs of this row"),
    "hardware.gpus_per_node": (8, "GPUs a node"),
    "hardware.node_gbytes": (150.0, "a node's all-reduce bus bandwidth, GB/s"),
    "hardware.nics_per_node": (1, "NICs a node"),
    "hardware.nic_gbits": (100.0, "each NIC's line rate, Gb/s"),
    "hardware.fabric": ("infiniband", "infiniband, roce or tcp"),
    "framework.bucketing": ("ddp", "ddp (buckets of bucket_mb during backward), one-bucket (after it), per-tensor"),
    "framework.bucket_mb": (25.0, "DDP's bucket_cap_mb"),
    "framework.hierarchical": (False, "all-reduce in the node, then between nodes, then in the node"),
    "published.step_seconds": (None, "the published step time, seconds"),
    "published.efficiency": (None, "the published scaling efficiency, 0..1"),
    "published.against": ("gpu", "what the efficiency is against: gpu (one GPU) or node (one node)"),
    "note": ("", "a note printed with the row"),
}


@dataclass(frozen=True)
class Row:
    table: str
    label: str
    source: str
    role: str
    values: dict[str, Any]  # KEYS' dotted names, resolved
    where: str  # FILE:row N, for a refusal


def _flat(mapping: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in mapping.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and prefix == "":
            out.update(_flat(value, f"{name}."))
        else:
            out[name] = value
    return out


def parse(raw: Any, defaults: dict[str, Any], where: str, index: int) -> Row:
    """One row of a file, its keys checked: LabError naming the file, the row, the key and what would do."""
    at = f"{where}: row {index + 1}"
    if not isinstance(raw, dict):
        raise LabError(f"{at}: a row is a mapping (row:, model:, hardware:, framework:, published:)")
    meta = {k: raw[k] for k in ("table", "row", "source", "role") if k in raw}
    given = {**_flat({k: v for k, v in defaults.items() if k not in ("table", "row", "source", "role")}),
             **_flat({k: v for k, v in raw.items() if k not in meta})}  # fmt: skip
    unknown = sorted(set(given) - set(KEYS))
    if unknown:
        raise LabError(f"{at}: {unknown[0]}: not a row key; the keys: {', '.join(KEYS)}")
    values = {name: given.get(name, default) for name, (default, _) in KEYS.items()}
    role = str(meta.get("role", defaults.get("role", "check")))
    if role not in ROLES:
        raise LabError(f"{at}: role: {role!r}; use one of {', '.join(ROLES)}")
    _check(values, at, role)
    label = str(meta.get("row", f"row {index + 1}"))
    table = str(meta.get("table", defaults.get("table", Path(where).stem)))
    return Row(table, label, str(meta.get("source", defaults.get("source", ""))), role, values, at)


def _check(values: dict[str, Any], at: str, role: str) -> None:
    required = ["model.parameters", "hardware.gpus"] + (["model.step_seconds"] if role != "cited" else [])
    for name in required:
        if values[name] is None:
            raise LabError(f"{at}: {name}: missing; give {KEYS[name][1]}")
    numbers = [k for k in KEYS if k.startswith(("model.", "hardware.", "published.")) and k not in TEXT_KEYS]
    for name in numbers:
        value = values[name]
        if isinstance(value, str):  # YAML 1.1 reads 25.6e6 (no sign in the exponent) as a string
            try:
                value = values[name] = float(value)
            except ValueError:
                pass
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0):
            raise LabError(f"{at}: {name}: {value!r}; use a number above 0 ({KEYS[name][1]})")
    for name, allowed in (
        ("model.precision", tuple(BYTES)),
        ("hardware.fabric", tuple(FABRICS)),
        ("framework.bucketing", BUCKETINGS),
        ("published.against", ("gpu", "node")),
    ):
        if values[name] not in allowed:
            raise LabError(f"{at}: {name}: {values[name]!r}; use one of {', '.join(allowed)}")
    if role == "check" and (values["published.step_seconds"] is None) == (values["published.efficiency"] is None):
        raise LabError(f"{at}: published: give one figure, step_seconds or efficiency")
    if values["framework.bucketing"] == "per-tensor" and values["model.tensors"] is None:
        raise LabError(f"{at}: model.tensors: missing; per-tensor all-reduce needs the parameter tensors' count")


def load(path: str | Path) -> list[Row]:
    """Every row of a YAML or JSON file."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise LabError(f"{path}: {exc.strerror or exc}; give a file of rows (docs/prediction.md)") from None
    try:
        doc = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise LabError(f"{path}: not YAML or JSON: {first}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("rows"), list) or not doc["rows"]:
        raise LabError(f"{path}: rows: missing; a file holds table:, source:, defaults: and a list of rows:")
    defaults = {**(doc.get("defaults") or {}), **{k: doc[k] for k in ("table", "source") if k in doc}}
    return [parse(raw, defaults, str(path), i) for i, raw in enumerate(doc["rows"])]


def shipped() -> list[Row]:
    """The published tables the lab ships, in a fixed order."""
    return [row for path in sorted(TABLES.glob("*.yaml")) for row in load(path)]


# ----------------------------------------------------------------------------- a prediction


@dataclass(frozen=True)
class Calibration:
    """The links a `lab validate` run measured (--calibration): a node's all-reduce bus bandwidth and all nodes'."""

    source: str
    node_gbytes: float
    nodes_gbytes: float | None
    ranks_per_node: int

    @classmethod
    def read(cls, path: str | Path) -> Calibration:
        try:
            doc = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            raise LabError(f"--calibration {path}: unreadable ({type(exc).__name__}); give a validate.json") from None
        nodes = (doc.get("nodes") if isinstance(doc, dict) else None) or {}
        judged = [
            n["pairs"][0].get("busbw") or n["pairs"][0].get("avg_busbw") for n in nodes.values() if n.get("pairs")
        ]
        judged = [b for b in judged if b]
        if not judged:
            raise LabError(f"--calibration {path}: no node's all-reduce figure in it; give a `lab validate` run's json")
        across = doc.get("all_nodes") or {}
        hosts = len(across.get("hosts") or []) or 1
        # the ranks a node ran in the all-nodes all-reduce; without one, each node's GPUs (a CPU node: its 2 ranks)
        per_node = int(across.get("world_size", 0)) // hosts or min(int(n.get("gpus") or 2) for n in nodes.values())
        return cls(str(path), min(judged), across.get("busbw") or across.get("avg_busbw"), max(1, per_node))


def inputs(row: Row, spread: float = SPREAD, calibration: Calibration | None = None) -> model.Inputs:
    """The model's inputs from a row, each number's source among its assumptions."""
    v = row.values
    bytes_each = v["model.bytes_per_gradient"] or BYTES[v["model.precision"]]
    efficiency, latency, fabric_source = FABRICS[v["hardware.fabric"]]
    node_bus = v["hardware.node_gbytes"] * 1e9
    nics = v["hardware.nics_per_node"] * v["hardware.nic_gbits"] / 8 * 1e9 * efficiency
    per_node = v["hardware.gpus_per_node"]
    used = [
        Assumption("node bus bandwidth", node_bus / 1e9, "GB/s", "published (the row)"),
        Assumption(f"{v['hardware.fabric']} efficiency", efficiency, "of line rate", fabric_source),
        Assumption("inter-node latency", latency * 1e6, "us a ring step", fabric_source),
    ]
    if calibration is not None:
        node_bus = calibration.node_gbytes * 1e9
        nics = (calibration.nodes_gbytes or calibration.node_gbytes) * 1e9
        per_node = calibration.ranks_per_node
        used = [
            Assumption("node bus bandwidth", node_bus / 1e9, "GB/s", f"measured: {calibration.source}"),
            Assumption("all nodes' bus bandwidth", nics / 1e9, "GB/s", f"measured: {calibration.source}"),
            Assumption("ranks a node", per_node, "", f"measured: {calibration.source}"),
            Assumption("inter-node latency", latency * 1e6, "us a ring step", "assumed (validate measures >= 1 GiB)"),
        ]
    step = v["model.step_seconds"]
    if v["model.wrapped_step_seconds"] is not None:
        wrapper, wrapped_from = max(0.0, v["model.wrapped_step_seconds"] - step), 1
        used.append(Assumption("wrapper's own cost", wrapper * 1e3, "ms a step", "published: its 1-GPU row"))
    else:
        wrapper, wrapped_from = WRAPPER_SHARE * step, 2
        used.append(Assumption("wrapper's own cost", WRAPPER_SHARE, "of the step", "assumed: WRAPPER_SHARE"))
    used.append(Assumption("ranks' spread", spread, "of the step", "fitted on the shipped rows' half: SPREAD"))
    bucketing = v["framework.bucketing"]
    grads = v["model.parameters"] * bytes_each
    bucket = (
        v["framework.bucket_mb"] * model.MIB
        if bucketing == "ddp"
        else grads / v["model.tensors"]
        if bucketing == "per-tensor"
        else grads
    )
    return model.Inputs(
        compute_seconds=step,
        other_seconds=0.0,
        gradient_bytes=grads,
        samples_per_rank=int(v["model.samples_per_gpu"]),
        bucket_bytes=bucket,
        intra=Link(INTRA_LATENCY_SECONDS, node_bus),
        inter=Link(latency, nics),
        gpus_per_node=int(per_node),
        overlap=0.0 if bucketing == "one-bucket" else 1.0,
        wrapper_seconds=wrapper,
        wrapped_from=wrapped_from,
        hierarchical=bool(v["framework.hierarchical"]),
        spread=spread,
        assumptions=tuple(used),
    )


def predict(row: Row, spread: float = SPREAD, calibration: Calibration | None = None) -> dict[str, Any]:
    """The row's figure predicted, its signed error ((predicted - published) / published) and its side:
    optimistic when it predicts a faster step or a higher efficiency than published."""
    v = row.values
    base = {"table": row.table, "row": row.label, "source": row.source, "role": row.role, "note": v["note"]}
    if row.role == "cited":
        figure = v["published.step_seconds"] or v["published.efficiency"]
        unit = "s/iter" if v["published.step_seconds"] else "efficiency"
        return {**base, "predicted": None, "published": figure, "unit": unit, "error": None, "side": None}
    given = inputs(row, spread, calibration)
    n = int(v["hardware.gpus"])
    at_n = model.predict(given, n)
    if v["published.step_seconds"] is not None:
        predicted, published, unit = at_n["step_seconds"], v["published.step_seconds"], "s/iter"
        optimistic = predicted < published
    else:
        reference = 1 if v["published.against"] == "gpu" else min(n, given.gpus_per_node)
        at_ref = model.predict(given, reference)
        predicted = at_ref["step_seconds"] / at_n["step_seconds"]
        published, unit = v["published.efficiency"], "efficiency"
        optimistic = predicted > published
    error = (predicted - published) / published
    return {
        **base,
        "predicted": predicted,
        "published": published,
        "unit": unit,
        "error": None if row.role == "input" else error,
        "side": None if row.role == "input" else ("optimistic" if optimistic else "pessimistic"),
        "assumptions": [a.line() for a in given.assumptions],
    }


# ----------------------------------------------------------------------------- the bound, set before the check


def halves(rows: list[Row], seed: int = SPLIT_SEED) -> tuple[list[Row], list[Row]]:
    """The rows that are checked (role check), split in two at random with a fixed seed (a split by position would
    put the same world sizes in each half): the first half to fit the spread and set the bound on, the second held
    out to check them."""
    checked = [r for r in rows if r.role == "check"]
    order = list(range(len(checked)))
    random.Random(seed).shuffle(order)
    first = set(order[: len(order) // 2])
    return [r for i, r in enumerate(checked) if i in first], [r for i, r in enumerate(checked) if i not in first]


def bias(results: list[dict[str, Any]]) -> dict[str, Any]:
    """How many rows each side holds, and the optimism: each row's |error| counted + where it is optimistic and -
    where pessimistic (a step time's and an efficiency's errors point opposite ways: this makes them one), its mean
    and its median."""
    errors = [r for r in results if r["error"] is not None]
    optimism = sorted(abs(r["error"]) if r["side"] == "optimistic" else -abs(r["error"]) for r in errors)
    middle = len(optimism) // 2
    median = (optimism[middle] + optimism[~middle]) / 2 if optimism else 0.0
    return {
        "rows": len(errors),
        "optimistic": sum(o > 0 for o in optimism),
        "pessimistic": sum(o <= 0 for o in optimism),
        "mean_optimism": sum(optimism) / len(optimism) if optimism else 0.0,
        "median_optimism": median,
        "largest_error": max((abs(r["error"]) for r in errors), default=0.0),
    }


SPREAD_GRID = tuple(step / 400 for step in range(25))  # 0 to 6%, a quarter point apart


def fit(rows: list[Row], grid: tuple[float, ...] = SPREAD_GRID) -> float:
    """The ranks' spread (0 to 6%, a quarter point apart) that leaves the predictions of `rows` on neither side: the
    median optimism nearest 0 (as many rows optimistic as pessimistic), the smaller spread where two are as near."""
    return min(grid, key=lambda s: (round(abs(bias([predict(r, s) for r in rows])["median_optimism"]), 4), s))


def bound(largest_error: float) -> float:
    """The largest error rounded up to the next 5 points: the bound held-out rows are checked against.

    >>> bound(0.152), bound(0.05)
    (0.2, 0.05)
    """
    return round(-(-largest_error // 0.05) * 0.05, 2)
