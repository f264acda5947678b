"""A seat on this host: its system user, its home (its own copy of the lessons, its own runs), its environment.

Each seat is a system user of its own (`useradd`, home mode 0700), so one learner's kernel cannot read another's
files; the hub (root) starts each seat's JupyterLab as that user. The home holds:

    notebooks/NN_name.ipynb (+ the paired .py, hidden in the file browser)   the seat's own copy of the lessons
    monitoring/                                                            what lesson 6's Prometheus reads
    runs/lessons/NN-name/checks.json                                       what `lab room status` reads

A seat's environment says who it is and what it holds: LAB_SEAT, CUDA_VISIBLE_DEVICES from the plan,
LAB_LESSON_RUNS, OMP_NUM_THREADS where cores are shared, the room's Pushgateway where there is one.
"""

from __future__ import annotations

import argparse
import os
import pwd
import shutil
import stat
import subprocess
import sys
from pathlib import Path

from lab.course.records import CHECK_TIMEOUT_ENV, LESSON_RUNS_ENV, PUSHGATEWAY_ENV, ROOM_CHECK_TIMEOUT_SECONDS
from lab.course.room.plan import Seat
from lab.errors import LabError
from lab.run.cluster import runner
from lab.run.cluster.gpu_queue import QUEUE_ENV
from lab.run.cluster.seat import ENV as SEAT_ENV

# Where the lessons come from: the checkout's notebooks/ (an editable install: `make room`), or LAB_LESSONS (the
# image copies them to /opt/lab/notebooks); monitoring/ beside them.
LESSONS_ENV = "LAB_LESSONS"
CHECKOUT = Path(__file__).resolve().parents[3]
# The Jupyter server's settings the lab ships (each lesson listed once): jupyter/config in a checkout, or where
# JUPYTER_CONFIG_PATH already points (the image's).
SERVER_CONFIG = CHECKOUT / "jupyter" / "config"
FIRST_LESSON = "notebooks/01_baseline_and_ddp.ipynb"
# docs/answers.md, the lessons' questions answered for instructors: left out of a seat's docs (lab.course.room.answers
# closes the original)
ANSWERS_DOC = "answers.md"


def lessons_dir() -> Path:
    """The folder of the shipped lessons (NN_name.py, jupytext's percent format)."""
    configured = os.environ.get(LESSONS_ENV)
    folder = Path(configured) if configured else CHECKOUT / "notebooks"
    if not any(folder.glob("[0-9][0-9]_*.py")):
        raise LabError(
            f"{folder}: no lessons there (NN_name.py); run from a checkout of the lab or set "
            f"{LESSONS_ENV} to the folder that holds them"
        )
    return folder


def lesson_files(folder: Path | None = None) -> list[Path]:
    return sorted((folder or lessons_dir()).glob("[0-9][0-9]_*.py"))


# ----------------------------------------------------------------------------- the system user


def home_of(name: str) -> Path | None:
    try:
        return Path(pwd.getpwnam(name).pw_dir)
    except KeyError:
        return None


# The comment (GECOS) of every system user a room makes: a seat may reuse a user made by an earlier room, never
# an account of someone's (whose processes the room would stop when it stops).
SEAT_COMMENT = "lab room seat"


def made_by_a_room(name: str) -> bool:
    try:
        return pwd.getpwnam(name).pw_gecos == SEAT_COMMENT
    except KeyError:
        return False


def ensure_user(name: str, home_root: Path) -> Path:
    """The seat's system user, created when missing (home under `home_root`, mode 0700); its home. A user of that
    name that a room did not make is refused: its processes and files are someone else's."""
    home = home_of(name)
    if home is not None and not made_by_a_room(name):
        raise LabError(
            f"seat {name}: a system user of that name exists and was not made by lab room; give the "
            f"seats other names (--prefix)"
        )
    if home is None:
        home = home_root / name
        done = runner.run(
            [
                "useradd",
                "--create-home",
                "--home-dir",
                str(home),
                "--shell",
                "/bin/bash",
                "--comment",
                SEAT_COMMENT,
                "--user-group",
                name,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            echo=False,
        )
        if done.returncode != 0:
            raise LabError(
                f"useradd {name}: {done.stderr.strip() or f'exited {done.returncode}'} (the room's "
                f"seats are system users: run lab room serve as root)"
            )
    home.mkdir(parents=True, exist_ok=True)
    user = pwd.getpwnam(name)
    os.chown(home, user.pw_uid, user.pw_gid)
    home.chmod(0o700)  # another seat cannot list or read it
    return home


def remove_user(name: str) -> None:
    """Delete a seat's system user and its home (tests, and an instructor clearing a room): only one a room made."""
    if made_by_a_room(name):
        runner.run(["userdel", "--remove", name], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, echo=False)


def unreachable(name: str, paths: list[Path]) -> str | None:
    """Why seat user `name` cannot run the lab's Python (a folder on the way it may not enter), or None.

    Tried for real, as the user (the interpreter imports the lab and JupyterHub); where that fails, the first
    folder on the way to each path whose mode gives others no search (x) permission is named."""
    user = pwd.getpwnam(name)
    try:
        done = runner.run(
            [sys.executable, "-c", "import lab.course.room, jupyterhub"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            echo=False,
            user=user.pw_uid,
            group=user.pw_gid,
            env={**os.environ, "HOME": user.pw_dir},
            timeout_seconds=60,
        )
        failure = None if done.returncode == 0 else done.last_error
    except PermissionError as exc:  # the interpreter itself could not be run
        failure = str(exc)
    if failure is None:
        return None
    for path in paths:
        for folder in reversed(Path(path).resolve().parents):
            mode = folder.stat().st_mode
            if not mode & stat.S_IXOTH:
                return (
                    f"seat {name} cannot reach {path}: {folder} is mode {stat.S_IMODE(mode):o}, closed to other "
                    f"users; run `chmod o+x {folder}` (search only: its listing stays closed), or install the "
                    f"lab where the seats can reach it (docs/workshop.md)"
                )
    return f"seat {name} cannot run {sys.executable} -c 'import lab.course.room, jupyterhub': {failure}"


# ----------------------------------------------------------------------------- the seat's home


def prepare_home(name: str, lessons: Path | None = None) -> Path:
    """The seat's home made ready (copy_lessons), everything in it owned by the seat. Returns the home."""
    home = home_of(name)
    if home is None:
        raise LabError(f"seat {name} has no system user; lab room serve creates it")
    user = pwd.getpwnam(name)
    for path in copy_lessons(home, lessons):
        os.chown(path, user.pw_uid, user.pw_gid)
    return home


def copy_lessons(home: Path, lessons: Path | None = None) -> list[Path]:
    """The seat's own copy of the lessons in home/notebooks (each .py paired with its .ipynb by jupytext, as `make
    notebook` does), lesson 6's monitoring/, the docs (answers.md left out) and examples/ lesson 1 links, and an
    empty runs/lessons/, each made when missing: a learner's edits and outputs survive a restart of their server;
    `lab room reset SEAT` starts a seat afresh. Returns what it made."""
    import jupytext

    source = lessons or lessons_dir()
    notebooks = home / "notebooks"
    made: list[Path] = []
    if not notebooks.exists():
        notebooks.mkdir(parents=True)
        made.append(notebooks)
        for path in lesson_files(source):
            shutil.copy2(path, notebooks / path.name)
            jupytext.write(jupytext.read(path), notebooks / f"{path.stem}.ipynb", fmt="ipynb")
            made += [notebooks / path.name, notebooks / f"{path.stem}.ipynb"]
    # lesson 6 starts a Prometheus with monitoring/; lesson 1 links docs/glossary.md and runs examples/
    for extra in ("monitoring", "docs", "examples"):
        if (source.parent / extra).is_dir() and not (home / extra).exists():
            shutil.copytree(source.parent / extra, home / extra, ignore=shutil.ignore_patterns(ANSWERS_DOC))
            made += [home / extra, *(home / extra).rglob("*")]
    runs = runs_dir(home)
    if not runs.exists():
        runs.mkdir(parents=True)
        made += [runs.parent, runs]
    return made


def reset_home(name: str) -> None:
    """A seat afresh: its copy of the lessons and its runs deleted (the next start copies the lessons again)."""
    home = home_of(name)
    if home is None:
        raise LabError(f"no seat {name} on this host")
    for folder in ("notebooks", "runs", "monitoring", "docs", "examples"):
        shutil.rmtree(home / folder, ignore_errors=True)


def runs_dir(home: Path) -> Path:
    """Where a seat's lessons write (LAB_LESSON_RUNS in its environment)."""
    return home / "runs" / "lessons"


def environment(
    seat: Seat, home: Path, pushgateway: str = "", prometheus_url: str = "", gpu_queue: str = ""
) -> dict[str, str]:
    """What the seat's server (and every kernel, lesson command and run under it) starts with, on any spawner."""
    env = {
        SEAT_ENV: seat.name,
        "CUDA_VISIBLE_DEVICES": seat.cuda_visible_devices,
        LESSON_RUNS_ENV: str(runs_dir(home)),
        CHECK_TIMEOUT_ENV: f"{ROOM_CHECK_TIMEOUT_SECONDS:g}",  # a class grading at once shares the cores
    }
    if gpu_queue:  # the room's whole GPUs, leased by the seat's multi-rank checks (lab.run.cluster.gpu_queue)
        env[QUEUE_ENV] = gpu_queue
    if not seat.cpus:  # shared cores: each process one thread's worth of the seat's share, at least 1
        env["OMP_NUM_THREADS"] = str(seat.threads)
    if pushgateway:
        env[PUSHGATEWAY_ENV] = pushgateway
    if prometheus_url:
        env["LAB_PROMETHEUS_URL"] = prometheus_url
    return env


def host_paths() -> dict[str, str]:
    """The hub host's paths a seat needs where it runs on them (a system user here, a Slurm job on nodes that share
    the checkout), not in a container, whose image has its own: the lab's Python first on PATH (`lab`, `torchrun`,
    `jupytext` in a terminal are the room's) and the server's settings (each lesson listed once)."""
    env = {"PATH": os.pathsep.join([str(Path(sys.executable).parent), "/usr/local/bin", "/usr/bin", "/bin"])}
    config = os.environ.get("JUPYTER_CONFIG_PATH") or (str(SERVER_CONFIG) if SERVER_CONFIG.is_dir() else "")
    if config:
        env["JUPYTER_CONFIG_PATH"] = config
    return env


def reset(args: argparse.Namespace) -> int:
    """`lab room reset SEAT`: the seat's copy of the lessons and its runs deleted (stop its server first)."""
    from lab.course.room import plan as room_plan

    name = room_plan.load(Path(args.room_dir) / "plan.json").seat(args.seat).name
    reset_home(name)
    print(f"{name}: its notebooks, runs, monitoring/, docs/ and examples/ deleted; its next start copies them afresh")
    return 0


def prepare(args: argparse.Namespace) -> int:
    """`lab room prepare-seat DIR`: a seat container's start (the image's lessons copied to its volume)."""
    made = copy_lessons(Path(args.home))
    print(f"{args.home}: {len(made)} files and folders made" if made else f"{args.home}: ready")
    return 0
