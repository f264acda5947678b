"""Shared helpers: run the real `lab` CLI and real torchrun, from this venv."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
# The Makefile's PYTHON (what the venvs are made from: `make test PYTHON=...`, .ci/run sets it) is not the PYTHON that
# scripts/gpu-check.sh runs its check with, and the tests of the check's own choice of interpreter must not inherit
# it: CI's, /usr/bin/python3 without torch, made one fail (2026-12-07). A test that wants one passes it.
os.environ.pop("PYTHON", None)
TORCHRUN = str(Path(sys.executable).parent / "torchrun")
TIMEOUT = 600  # seconds: a hung collective must fail the test, not CI


def run(
    cmd: list[str], cwd: Path | None = None, env: dict | None = None, check: bool = True, timeout: int = TIMEOUT
) -> subprocess.CompletedProcess:
    full_env = {**os.environ, **(env or {})}
    proc = subprocess.run(cmd, cwd=cwd or ROOT, env=full_env, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{' '.join(cmd)} exited {proc.returncode}\n--- stdout\n{proc.stdout[-4000:]}"
            f"\n--- stderr\n{proc.stderr[-6000:]}"
        )
    return proc


def lab(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return run([PYTHON, "-m", "lab", *args], **kwargs)


def torchrun(nproc: int, *args: str, **kwargs) -> subprocess.CompletedProcess:
    env = {"OMP_NUM_THREADS": "1", **kwargs.pop("env", {})}
    return run([TORCHRUN, "--standalone", "--nproc-per-node", str(nproc), *args], env=env, **kwargs)


def metrics(run_dir: Path, kind: str = "train") -> list[dict]:
    return [r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if r["kind"] == kind]


# A narrow ResNet-18 on a little synthetic data: seconds per run on 2 cores.
TINY = ["--config", "smoke", "--set", "model.width=8"]


def _require(module: str, flag: str, why: str) -> None:
    """At an optional strategy's test module's top: skip it where `module` is missing, saying why, or fail when
    the environment sets `flag`=1 (make test does: .venv always has it)."""
    import importlib.util

    if importlib.util.find_spec(module) is not None:
        return
    if os.environ.get(flag) == "1":
        pytest.fail(f"{flag}=1 but {why}", pytrace=False)
    pytest.skip(why, allow_module_level=True)


def require_deepspeed() -> None:
    """DeepSpeed's tests: LAB_REQUIRE_DEEPSPEED=1 under make test (.venv has it after make's second pip step)."""
    _require(
        "deepspeed",
        "LAB_REQUIRE_DEEPSPEED",
        "DeepSpeed is not installed in this venv: the [deepspeed] extra goes into .venv only (make's second "
        "pip step, DS_BUILD_OPS=0 --no-build-isolation); the lowest-torch venv tests without it",
    )


def require_horovod() -> None:
    """Horovod's tests: LAB_REQUIRE_HOROVOD=1 under make test (after `make horovod` built it into .venv)."""
    _require(
        "horovod",
        "LAB_REQUIRE_HOROVOD",
        "Horovod is not installed in this venv: `make horovod` builds it into .venv only "
        "(third_party/horovod/build.sh); the lowest-torch venv tests without it",
    )


@pytest.fixture(scope="session")
def lessons(tmp_path_factory):
    """`lessons("02_pitfalls")`: that lesson executed once this session (tests/lessons.py), whichever test asks
    first, on whichever xdist worker: the notebook test asserts its checks, the tests that need the same runs read
    its results."""
    from tests.lessons import NOTEBOOKS, ExecutedLesson, executed

    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")  # one id for every worker of this session (pytest-xdist)
    base = tmp_path_factory.getbasetemp()
    shared = base.parent / f"lessons-{run}" if run else base / "lessons"
    seen: dict[str, ExecutedLesson] = {}

    def lesson(stem: str) -> ExecutedLesson:
        if stem not in seen:
            seen[stem] = executed(NOTEBOOKS / f"{stem}.py", shared)
        return seen[stem]

    return lesson


@pytest.fixture
def runs_dir(tmp_path: Path) -> Path:
    return tmp_path / "runs"


# The cost tier of every test in a folder (pyproject.toml registers the marks; `make test-fast` leaves them out).
# A unit test that costs as much carries its own mark, at the test.
FOLDER_TIERS = {"distributed": pytest.mark.torchrun, "infra": pytest.mark.infra, "notebooks": pytest.mark.notebook}


# The order files run in: the longest first (a worker's seconds per file, make test on 2 cores and 3 workers,
# 2026-12-07; the container's with its image built cold), then the rest by folder, so the xdist workers end together
# on short files instead of one finishing a long file alone. Makefile's --no-loadscope-reorder keeps this order
# (pytest-xdist otherwise puts the files with the most tests first, and the long files of one or two tests last).
# A file missing here costs a minute or less; a new long one belongs here.
FILE_SECONDS = {
    "notebooks/test_notebooks.py": 630,
    "infra/test_ansible.py": 500,
    "infra/test_slurm.py": 330,
    "infra/test_room.py": 300,
    "distributed/test_exercise_convert.py": 290,
    "distributed/test_exercise_own_ddp.py": 260,
    "infra/test_container.py": 250,
    "distributed/test_performance.py": 240,
    "distributed/test_exercise_comm.py": 210,
    "distributed/test_exercise_pitfalls.py": 210,
    "distributed/test_faults.py": 190,
    "infra/test_prometheus.py": 180,
    "distributed/test_hang.py": 170,
    "distributed/test_foreign_hang.py": 170,
    "distributed/test_ddp_training.py": 150,
    "distributed/test_fsdp.py": 150,
    "distributed/test_benchmarks.py": 150,
    "unit/test_cli_bad_input.py": 150,
    "unit/test_workshop.py": 130,
    "infra/test_telemetry.py": 130,
    "distributed/test_deepspeed.py": 120,
    "distributed/test_course_scripts.py": 120,
    "distributed/test_horovod.py": 80,
    "distributed/test_orphans.py": 80,
}
FOLDER_ORDER = ("notebooks", "infra", "distributed", "unit")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    tests = ROOT / "tests"
    for item in items:
        if item.path.is_relative_to(tests) and (parts := item.path.relative_to(tests).parts):
            if tier := FOLDER_TIERS.get(parts[0]):
                item.add_marker(tier)

    def rank(item: pytest.Item) -> tuple[int, int]:
        parts = item.path.relative_to(tests).parts if item.path.is_relative_to(tests) else ()
        folder = FOLDER_ORDER.index(parts[0]) if parts and parts[0] in FOLDER_ORDER else len(FOLDER_ORDER)
        return -FILE_SECONDS.get("/".join(parts), 0), folder

    items.sort(key=rank)  # stable: within a file and among the unlisted files of a folder, the order stays
