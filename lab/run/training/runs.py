"""Run records: the run id, the run directory and what is written into it.

    runs/<run_id>/config.json      the checked config and run id `lab train --nproc-per-node` hands its workers
    runs/<run_id>/manifest.json    what ran: resolved config, versions, hosts, environment
    runs/<run_id>/metrics.jsonl    one row per log interval (and per evaluation)
    runs/<run_id>/summary.json     how it ended: final loss, accuracy, throughput, wall time, status
    runs/<run_id>/checkpoints/     last.pt, written by global rank 0

Only global rank 0 writes here, and `lab train --nproc-per-node` before its workers start: it checks the config
once, decides the run id and writes config.json, which the workers read. (`lab launch` hands its workers the same
file from a folder of its own, removed when they end: another node keeps no run directory of its own.) JSON files are
replaced atomically, so a reader
never sees half a file; metrics.jsonl is appended one flushed line at a time.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import secrets
import shutil
import subprocess
from pathlib import Path
from typing import Any, NamedTuple

from lab import atomic
from lab.errors import ConfigError, LabError
from lab.run.config import Config, from_dict, to_dict

RESOLVED = "config.json"
RUN_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def new_run_id(name: str) -> str:
    """A sortable, unique id: time stamp, name, short random part.

    >>> bool(RUN_ID_PATTERN.match(new_run_id("ddp")))
    True
    """
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-") or "run"
    return f"{stamp}-{slug}-{secrets.token_hex(3)}"


def rendezvous_run_id(name: str, rendezvous_id: str) -> str:
    """The run id of a torchrun job: its name and rendezvous id, the same on every node and after
    every restart of the worker group, so `checkpoint.resume: auto` finds the group's checkpoint.

    >>> rendezvous_run_id("ddp", "job/42")
    'ddp-job-42'
    """
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", f"{name}-{rendezvous_id}").strip("-.")
    return slug[:128]


def run_id_for(name: str, given: str, rendezvous_id: str | None) -> str:
    """The one rule for a run's id: run.id when given; else, for a torchrun job, the name and its rendezvous id
    (stable across restarts and the same on every node, so a restarted group resumes its own checkpoint); else a
    new time-stamped id. The process that decides it is the launching parent, or rank 0 where torchrun was typed.

    >>> run_id_for("ddp", "mine", "job/42"), run_id_for("ddp", "", "job/42")
    ('mine', 'ddp-job-42')
    """
    if given:
        return given
    if rendezvous_id:
        return rendezvous_run_id(name, rendezvous_id)
    return new_run_id(name)


class Handoff(NamedTuple):
    """What a launching parent hands its workers: their command, and the run directory it made for them (None when
    the file went into a folder of the launcher's own)."""

    target: list[str]
    run_dir: RunDir | None
    run_id: str


def write_resolved(cfg: Config, world_size: int | None, folder: Path | None = None) -> tuple[Path, RunDir | None]:
    """config.json in `folder`, else in the run directory (created here, and proven writable): the config as
    checked for `world_size` ranks (None: not known before the rendezvous), with its run id. The workers read it
    (`lab train --resolved PATH`) instead of parsing and checking the command line again."""
    run_dir = None if folder else RunDir(cfg.run.output_dir, cfg.run.id).create()
    path = (run_dir.path if run_dir is not None else Path(str(folder))) / RESOLVED
    write_json(path, {"run_id": cfg.run.id, "origin": cfg.origin, "world_size": world_size, "config": to_dict(cfg)})
    return path, run_dir


def resolved_target(
    cfg: Config, world_size: int | None, rendezvous_id: str | None = None, folder: Path | None = None
) -> Handoff:
    """What each worker of a launched run runs: `-m lab train --resolved PATH`, PATH the checked config with its
    run id (`run_id_for`), written by `write_resolved` into the run directory or `folder`."""
    from lab.run.config import with_overrides

    run_id = run_id_for(cfg.run.name, cfg.run.id, rendezvous_id)
    path, run_dir = write_resolved(with_overrides(cfg, run={"id": run_id}), world_size, folder)
    return Handoff(["-m", "lab", "train", "--resolved", str(path)], run_dir, run_id)


def read_resolved(path: str | Path) -> tuple[Config, int | None]:
    """The config a launching parent checked, and the world size it checked it for."""
    try:
        doc = read_json(path)
        return from_dict(doc["config"], doc["origin"]), doc["world_size"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise LabError(
            f"{path}: not a resolved config `lab train --nproc-per-node` or `lab launch` wrote "
            f"({type(exc).__name__}: {exc}); give the run's config with --config instead"
        ) from None


def check_run_id(run_id: str) -> str:
    if not RUN_ID_PATTERN.match(run_id):
        raise ConfigError(
            f"run.id: {run_id!r} is not a valid run id; use letters, digits, '.', '_' and '-' "
            f"(at most 128, not starting with a separator)"
        )
    return run_id


class RunDir:
    def __init__(self, output_dir: str | Path, run_id: str) -> None:
        self.run_id = check_run_id(run_id)
        self.path = Path(output_dir) / run_id
        self.manifest = self.path / "manifest.json"
        self.metrics = self.path / "metrics.jsonl"
        self.summary = self.path / "summary.json"
        self.checkpoints = self.path / "checkpoints"
        self.made = False  # whether create() made the directory (a refused start removes what it made)

    def create(self) -> RunDir:
        """Create the directory and prove it writable now, not after an hour of training."""
        self.made = self.made or not self.path.exists()
        try:
            self.checkpoints.mkdir(parents=True, exist_ok=True)
            probe = self.path / f".write-test-{os.getpid()}"
            probe.write_bytes(b"\0" * 4096)
            probe.unlink()
        except OSError as exc:
            raise LabError(
                f"run.output_dir: cannot write to {self.path} ({exc.strerror or exc}); "
                f"choose a writable directory with --set run.output_dir=DIR"
            ) from None
        self._clear_crash_leftovers()
        return self

    def remove_if_unstarted(self) -> None:
        """A run refused (or failed) before its first start was recorded leaves the tree as it found it: the
        directory goes when this process made it and no manifest was written into it."""
        if self.made and not self.manifest.exists():
            shutil.rmtree(self.path, ignore_errors=True)

    def _clear_crash_leftovers(self) -> None:
        """A process killed mid-write can leave a torn last metrics row and lab.atomic temp files (`*.tmp-*`:
        a checkpoint, a JSON record, a trace). Nothing writes them while rank 0 starts the run, so all are stale:
        drop them before appending."""
        for tmp in [*self.checkpoints.glob("*.tmp-*"), *self.path.glob("*.tmp-*"), *self.path.glob(".write-test-*")]:
            tmp.unlink(missing_ok=True)
        if self.metrics.exists() and self.metrics.stat().st_size:
            with open(self.metrics, "r+b") as f:
                f.seek(-1, os.SEEK_END)
                if f.read(1) != b"\n":
                    text = self.metrics.read_bytes()
                    f.truncate(text.rfind(b"\n") + 1)

    def check_space(self, need_bytes: int, what: str) -> None:
        """Refuse to start when the file system cannot hold `need_bytes` more."""
        free = shutil.disk_usage(self.path).free
        if free < need_bytes:
            raise LabError(
                f"run.output_dir: {self.path} has {free / 2**20:.1f} MiB free but this run needs about "
                f"{need_bytes / 2**20:.1f} MiB ({what}); free some space or choose another directory "
                f"with --set run.output_dir=DIR"
            )

    def progress(self) -> tuple[int, int]:
        """(the furthest step the run's last start logged, steps redone by earlier restarts); (0, 0) for a
        new run. A restart resuming from step s redoes (furthest - s) steps: the work its predecessor lost."""
        if not self.manifest.exists():
            return 0, 0
        starts = read_json(self.manifest).get("starts", [])
        last: dict[str, Any] = starts[-1] if starts else {"time": 0.0, "step": 0}
        since = [
            r["step"] for r in _rows(self.metrics) if r.get("kind") == "train" and r.get("time", 0) >= last["time"]
        ]
        return max(since, default=last["step"]), sum(s.get("steps_redone", 0) for s in starts)

    def write_manifest(self, manifest: dict[str, Any]) -> None:
        """Write the manifest; on a resumed run keep the first one and add this start to its history."""
        if self.manifest.exists():
            previous = read_json(self.manifest)
            starts = previous.get("starts", []) + manifest.get("starts", [])
            manifest = {**previous, "starts": starts}
        write_json(self.manifest, manifest)

    def append_metrics(self, row: dict[str, Any]) -> None:
        with open(self.metrics, "a") as f:
            f.write(json.dumps(row, sort_keys=True) + "\n")

    def write_summary(self, summary: dict[str, Any]) -> None:
        write_json(self.summary, summary)


def write_json(path: str | Path, obj: Any) -> None:
    atomic.write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def read_json(path: str | Path) -> Any:
    return json.loads(Path(path).read_text())


def read_metrics(run_path: str | Path, kind: str = "train") -> list[dict[str, Any]]:
    """The rows of a run's metrics.jsonl with `kind` ('train' or 'eval'), as the run finally went: after a
    restart from a checkpoint the steps logged again replace those the lost attempt had logged.

    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (d / "metrics.jsonl").write_text("".join(
    ...     f'{{"kind": "train", "step": {s}, "attempt": {a}}}\\n'
    ...     for s, a in [(1, 0), (2, 0), (3, 0), (2, 1), (3, 1)]))
    >>> [(r["step"], r["attempt"]) for r in read_metrics(d)]
    [(1, 0), (2, 1), (3, 1)]
    """
    rows: list[dict[str, Any]] = []
    for row in _rows(Path(run_path) / "metrics.jsonl"):
        if row.get("kind") == kind:
            while rows and rows[-1]["step"] >= row["step"]:
                rows.pop()  # logged by an attempt that died before its next checkpoint
            rows.append(row)
    return rows


def _rows(path: Path) -> list[dict[str, Any]]:
    """Every complete row of a metrics.jsonl, in file order (none when the file does not exist)."""
    if not path.exists():
        return []
    rows = []
    with open(path) as f:
        for line in f:
            if not line.endswith("\n"):
                break  # a row being written, or torn by a kill: not a row yet
            rows.append(json.loads(line))
    return rows


def git_revision() -> str | None:
    """The lab's git revision: LAB_GIT_REVISION (set in images) or the checkout's HEAD, '+dirty' if modified."""
    if os.environ.get("LAB_GIT_REVISION"):
        return os.environ["LAB_GIT_REVISION"]
    here = Path(__file__).resolve().parent
    try:
        rev = subprocess.run(
            ["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,  # status's output is the answer; a failure leaves it empty: not dirty
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{rev}+dirty" if dirty else rev
