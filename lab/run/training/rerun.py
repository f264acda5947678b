"""`lab rerun RUN_DIR`: train a recorded run again and say whether its loss curve came back.

    lab train --config smoke --set run.deterministic=true --set run.id=demo
    lab rerun runs/demo                                   # exit 0: "bit-identical"
    lab rerun runs/demo --steps 4 --set run.seed=1 --json rerun.json   # exit 3: a deterministic run differed

The record is RUN_DIR/manifest.json (resolved config, data source, world size, versions, threads) and
RUN_DIR/metrics.jsonl (the curve). The rerun trains the recorded config again, on this node with the recorded
world size, into a new run directory beside RUN_DIR (or --output-dir), then compares the curves wherever both
logged the same thing: a train row's `loss` (the mean since the previous row, so only rows over the same steps
compare) and an evaluation's `test_loss`. Exit codes: 0 the curve came back: bit-identical, or differing in a
run that was not deterministic (how far, within float32 drift or beyond it, is printed: non-deterministic
kernels may diverge by any amount, so that is information, not a gate); 3 a run recorded with
run.deterministic, and rerun with it, is not bit-identical; 1 the rerun's training failed; 2 bad input.
"""

from __future__ import annotations

import datetime
import math
import os
import secrets
import shlex
import sys
import tempfile
from pathlib import Path
from typing import Any, NamedTuple

import yaml

import lab
from lab.errors import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_GATE_MISSED, EXIT_OK, ConfigError, DataError, LabError
from lab.run import config
from lab.run.cluster import runner
from lab.run.training import runs

# A heuristic, not a proof: the relative difference two float32 runs of one config may show with no bug, when
# non-deterministic kernels (atomics, algorithm choice, all-reduce order) add the same numbers in another
# order. Each reordered sum is off by about float32's epsilon (1.2e-7) and training amplifies that step after
# step; 1e-3 is meant to cover tens to a few hundred steps of a small model. It has not been measured on GPUs
# here; a long run or a high learning rate can drift further from rounding alone, and a bug can hide below it.
FLOAT32_DRIFT = 1e-3

REQUIRED_KEYS = ("run_id", "config", "world_size", "data", "versions")


class Record(NamedTuple):
    path: Path
    manifest: dict[str, Any]
    train: list[dict[str, Any]]
    evals: list[dict[str, Any]]


class Comparison(NamedTuple):
    steps_compared: int
    identical: bool
    max_relative_difference: float
    at_step: int | None
    within_float32_drift: bool


def load_record(run_dir: str | Path) -> Record:
    """A run's manifest and metrics rows (after a restart, the rows as the run finally went), or a LabError."""
    path, manifest_path, metrics_path = Path(run_dir), Path(run_dir) / "manifest.json", Path(run_dir) / "metrics.jsonl"
    if not path.is_dir():
        raise LabError(f"{path}: no such run directory; give a directory `lab train` wrote, e.g. runs/<run id>")
    if not manifest_path.is_file():
        raise LabError(
            f"{manifest_path}: not found; a run directory from `lab train` holds manifest.json and metrics.jsonl"
        )
    try:
        manifest = runs.read_json(manifest_path)
    except (OSError, ValueError) as exc:
        raise LabError(f"{manifest_path}: unreadable ({exc}); expected the JSON object `lab train` writes") from None
    missing = [k for k in REQUIRED_KEYS if k not in manifest] if isinstance(manifest, dict) else list(REQUIRED_KEYS)
    if missing or not (
        isinstance(manifest["config"], dict)
        and isinstance(manifest["data"], dict)
        and isinstance(manifest["world_size"], int)
        and manifest["world_size"] >= 1
    ):
        raise LabError(
            f"{manifest_path}: missing or malformed key(s) {', '.join(missing) or 'config/data/world_size'}"
            f"; expected a manifest from `lab train` with {', '.join(REQUIRED_KEYS)}"
        )
    try:
        train, evals = runs.read_metrics(path, "train"), runs.read_metrics(path, "eval")
        for row in train + evals:  # numbers where the comparison needs them, or refuse the record now
            value = row["loss"] if row["kind"] == "train" else row["test_loss"]
            if not isinstance(row["step"], int) or not isinstance(value, (int, float)):
                raise ValueError(f"step {row['step']!r}, value {value!r}")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise LabError(
            f"{metrics_path}: unreadable row ({type(exc).__name__}: {exc}); expected JSON lines with "
            f"kind, an integer step and a loss (train) or test_loss (eval)"
        ) from None
    if not train:
        raise LabError(
            f'{metrics_path}: no train rows (kind "train" with step and loss)'
            f"{'' if metrics_path.exists() else ', the file does not exist'}; there is no curve to compare"
        )
    return Record(path, manifest, train, evals)


def rerun_config(
    record: Record, steps: int | None, user_overrides: list[str], output_dir: str | None, yaml_path: Path
) -> tuple[list[str], config.Config, int]:
    """The --set list that turns the recorded config (written to `yaml_path`) into the rerun's, the config it
    loads to (every check of `lab train` applied), and the last step to compare."""
    m, manifest_path = record.manifest, record.path / "manifest.json"
    yaml_path.write_text(yaml.safe_dump(m["config"], sort_keys=False))
    first, last = record.train[0]["step"], record.train[-1]["step"]
    limit = min(steps or last, last)  # train no further than the record goes: nothing beyond would compare
    if limit < first:
        raise LabError(
            f"--steps {steps}: the record's first train row is at step {first} (train.log_every), so "
            f"nothing would be compared; use --steps {first} or more"
        )
    stamp, data = datetime.datetime.now().strftime("%Y%m%d-%H%M%S"), m["data"]
    reads_files = data.get("source") == "cifar10" or "files in" in str(data.get("description", ""))
    source = []  # `lab data synth` files keep the config's source (it reads them); else pin what the record used,
    if data.get("source") == "cifar10" or not reads_files:  # so a CIFAR-10 folder here cannot change `auto`
        source = [f"data.source={'cifar10' if reads_files else 'synthetic'}"]
    overrides = [
        f"run.id={m['run_id'][:96]}-rerun-{stamp}-{secrets.token_hex(2)}",
        f"run.output_dir={output_dir or record.path.parent}",
        "checkpoint.resume=never",
        # a rerun must not take the record's metrics ports nor push or publish under its name
        "metrics.port_base=0",
        "metrics.pushgateway=",
        "metrics.targets_dir=",
        # stop_after_steps, not max_steps: max_steps would shorten the learning-rate schedule
        f"train.stop_after_steps={limit if limit < m.get('total_steps', math.inf) else 0}",
        *source,
        *user_overrides,
    ]
    try:
        cfg = config.load(yaml_path, overrides)
        config.check_layout(cfg, int(m["world_size"]))
    except ConfigError as exc:  # name the record, not a temporary file
        raise ConfigError(str(exc).replace(str(yaml_path), f"{manifest_path} (config)")) from None
    if reads_files:
        from lab.run.data import layout

        if not layout.present(cfg.data.root):
            raise DataError(
                f"{manifest_path}: data: the record trained on {data.get('description')}, but "
                f"{layout.folder(cfg.data.root)} is not here; put the same files there, or point "
                f"--set data.root=DIR at them"
            )
    return overrides, cfg, limit


def curve(record: Record, limit: int) -> dict[tuple[int, str], float]:
    """The points of a run's curve up to `limit`, keyed (step, what): a train row is the mean loss since the
    previous row or since the run (re)started, so that span is part of its key."""
    starts = [s.get("step", 0) for s in record.manifest.get("starts", [])]
    points, previous = {}, 0
    for row in record.train:
        begin = max([previous, *(s for s in starts if s < row["step"])])
        previous = row["step"]
        if row["step"] <= limit:
            points[(row["step"], f"loss over steps {begin + 1}-{row['step']}")] = float(row["loss"])
    points.update({(r["step"], "test_loss"): float(r["test_loss"]) for r in record.evals if r["step"] <= limit})
    return points


def compare_curves(original: dict[tuple[int, str], float], rerun: dict[tuple[int, str], float]) -> Comparison:
    """Compare two curves at the points both have; the relative difference is |a-b| / max(|a|, |b|, 1e-12).

    >>> a = {(2, "loss"): 2.25, (4, "loss"): 2.0, (4, "test_loss"): 2.5}
    >>> compare_curves(a, dict(a))
    Comparison(steps_compared=2, identical=True, max_relative_difference=0.0, at_step=None, within_float32_drift=True)
    >>> c = compare_curves(a, {**a, (4, "loss"): 2.0005, (6, "loss"): 1.5})
    >>> c.steps_compared, c.identical, round(c.max_relative_difference, 6), c.at_step, c.within_float32_drift
    (2, False, 0.00025, 4, True)
    """
    common = sorted(original.keys() & rerun.keys())
    worst, at = 0.0, None
    for key in common:
        a, b = original[key], rerun[key]
        if a == b or (math.isnan(a) and math.isnan(b)):
            continue
        finite = math.isfinite(a) and math.isfinite(b)
        diff = abs(a - b) / max(abs(a), abs(b), 1e-12) if finite else math.inf
        if at is None or diff > worst:
            worst, at = diff, key[0]
    return Comparison(len({k[0] for k in common}), at is None, worst, at, worst <= FLOAT32_DRIFT)


def environment_warnings(record: dict[str, Any], rerun: dict[str, Any]) -> list[str]:
    """One line per version or device that differs between the record's manifest and the rerun's (which the
    rerun's own processes wrote, so the parent never imports torch): results may differ across them."""
    recorded, here = record.get("versions") or {}, {**(rerun.get("versions") or {}), "lab": lab.__version__}
    lines = [
        f"warning: {name} {recorded[name]} recorded, {here.get(name)} here; results may differ across versions"
        for name in ("python", "torch", "torchvision", "lab")
        if name in recorded and recorded[name] != here.get(name)
    ]
    was, now = (str((m.get("ranks") or [{}])[0].get("device", "")).split(":")[0] for m in (record, rerun))
    if was != now:
        lines.append(
            f"warning: the record ran on {was or 'an unrecorded device'}, this rerun on {now}; results "
            f"may differ across devices"
        )
    return lines


def run(args: Any) -> int:
    """`lab rerun`: exit 0 reproduced, 3 a deterministic run was not, 1 the rerun failed (LabError: bad input)."""
    record = load_record(args.run_dir)
    m = record.manifest
    world, hosts = int(m["world_size"]), m.get("hosts") or []
    with tempfile.TemporaryDirectory(prefix="lab-rerun-") as tmp:
        yaml_path = Path(tmp) / "config.yaml"
        overrides, cfg, limit = rerun_config(record, args.steps, list(args.overrides or []), args.output_dir, yaml_path)
        warnings, env = [], dict(os.environ)
        threads = ((m.get("ranks") or [{}])[0]).get("threads")
        if threads and "OMP_NUM_THREADS" not in env:  # CPU kernels split their sums by thread: keep the record's
            env["OMP_NUM_THREADS"] = str(threads)
        elif threads and env["OMP_NUM_THREADS"] != str(threads):
            warnings.append(
                f"warning: the record used {threads} thread(s) per rank, OMP_NUM_THREADS is "
                f"{env['OMP_NUM_THREADS']} here; CPU results may differ"
            )
        for line in warnings:
            print(line)
        if len(hosts) > 1:
            print(
                f"the record ran on {len(hosts)} hosts ({', '.join(hosts)}); this rerun puts all {world} ranks on "
                f"this node, which is fine for comparing curves"
            )
        command = [sys.executable, "-m", "lab", "train", "--config", str(yaml_path)]
        command += ["--nproc-per-node", str(world)] if world > 1 else []
        command += [arg for item in overrides for arg in ("--set", item)]
        new_path = Path(cfg.run.output_dir) / cfg.run.id
        print(
            f"rerun of {record.path} (world size {world}, steps 1-{limit}) into {new_path}\n$ {shlex.join(command)}",
            flush=True,
        )
        code = runner.run(command, env=env, processes=world, echo=False).returncode  # the $ line is printed above
    if code != 0:
        print(f"lab rerun: the rerun's `lab train` exited {code} (its output is above)", file=sys.stderr)
        return EXIT_BAD_INPUT if code == EXIT_BAD_INPUT else EXIT_FAILED
    new = load_record(new_path)
    for line in environment_warnings(m, new.manifest):
        print(line)
        warnings.append(line)
    result = compare_curves(curve(record, limit), curve(new, limit))
    if not result.steps_compared:
        raise LabError(
            f"{record.path / 'metrics.jsonl'}: no step logged by both the record and the rerun up to "
            f"step {limit}; use a larger --steps, or a --set that keeps train.log_every"
        )
    deterministic = bool(m["config"].get("run", {}).get("deterministic")) and cfg.run.deterministic
    drift = "within" if result.within_float32_drift else "beyond"
    verdict = "bit-identical" if result.identical else f"differs, {drift} float32 drift"
    worst = "0" if result.identical else f"{result.max_relative_difference:.1e} at step {result.at_step}"
    if deterministic and not result.identical:
        print(
            "the record and the rerun are deterministic (run.deterministic: true): any difference means the "
            "run did not reproduce" + (f" (with --set {' '.join(args.overrides)})" if args.overrides else "")
        )
    print(
        f"| steps compared | verdict | largest relative difference | new run |\n|---:|---|---:|---|\n"
        f"| {result.steps_compared} | {verdict} | {worst} | {new_path} |"
    )
    if getattr(args, "json", None):
        runs.write_json(
            args.json,
            {
                "kind": "rerun",
                "original": str(record.path),
                "rerun": str(new_path),
                "verdict": verdict,
                **result._asdict(),
                "float32_drift_bound": FLOAT32_DRIFT,
                "deterministic": deterministic,
                "overrides": list(args.overrides or []),
                "steps": args.steps,
                "version_warnings": warnings,
            },
        )
    return EXIT_GATE_MISSED if deterministic and not result.identical else EXIT_OK
