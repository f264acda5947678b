"""What the lessons' notebook cells call (notebooks/*.py): run a lab command with its output shown live,
read what it wrote, show a table or a plot inline, and check what the learner should see.

A lesson runs the same commands a learner types in the terminal beside it, in a subprocess: torchrun,
gloo or NCCL and the exporters behave exactly as on the command line, and a crashed run cannot take the
kernel down. The sizes follow the machine, as plan() decides once for every lesson: `smoke`-sized runs on
2 CPU processes (minutes) where there are fewer than 2 GPUs (one GPU cannot hold two ranks), as-is on GPUs.

>>> folder = output_dir("01-demo", root="/tmp/lab-lessons")
>>> folder.name, folder.parent.name
('01-demo', 'lab-lessons')
>>> expect(2 + 2 == 4, "two and two make four")
as expected: two and two make four
>>> expect(2 + 2 == 5, "two and two make five")
Traceback (most recent call last):
lab.course.teaching.lesson.NotWhatYouShouldSee: two and two make five
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from lab.course import records
from lab.run.cluster import cores, gpu_queue, runner
from lab.verdict import FAILED, HELD, NOT_RUN, Check

# Where lessons write their runs: runs/lessons/ in the checkout (the repository with `make notebook`, /lab in
# the image), or LAB_LESSON_RUNS (lab.course.records).
ROOT_ENV = records.LESSON_RUNS_ENV
# The folder of the lesson this kernel runs (output_dir's, fresh): where expect() records its checks.
_folder: Path | None = None
# This kernel's lesson chose to stay off the room's GPU queue (plan(queue=False)): none of its commands lease.
_off_the_queue = False


class NotWhatYouShouldSee(AssertionError):
    """A lesson's check failed: the cell stops, red, with what was expected."""


class Finished(subprocess.CompletedProcess):
    """A command's outcome; shown as one line where a cell ends with it (its output was already shown live)."""

    def __repr__(self) -> str:
        return f"exited {self.returncode}"


def checkout() -> Path:
    """The folder that holds notebooks/: JupyterLab starts a kernel in the notebook's own folder, a script
    may start in the checkout itself.

    >>> checkout() == (Path.cwd().parent if Path.cwd().name == "notebooks" else Path.cwd())
    True
    """
    here = Path.cwd()
    return here.parent if here.name == "notebooks" else here


def checkout_file(relative: str) -> Path | None:
    """A file of the lab's checkout (playbooks/, monitoring/), or None where it is not (the image has neither)."""
    path = checkout() / relative
    return path if path.exists() else None


def free_ports(count: int = 1) -> int:
    """A TCP port p such that p .. p+count-1 are free on this machine now: a rendezvous, a Prometheus of the
    lesson's own, or exporters where rank r serves /metrics on p + r."""
    import socket

    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + count > 65535:
            continue
        try:
            for offset in range(1, count):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", base + offset))
            return base
        except OSError:
            continue
    raise RuntimeError(f"no {count} free ports in a row")


# Test-only: pretend this machine has N GPUs (the notebook tests plan every lesson for a 1-GPU host on a CPU
# machine). Never set it for a real lesson: commands planned for GPUs that are not there fail.
FAKE_GPUS_ENV = "LAB_LESSON_FAKE_GPUS"


@dataclass(frozen=True)
class Plan:
    """Where a lesson's commands run, decided once for every lesson from the GPUs this machine shows.

    A multi-rank part needs one device per rank (NCCL cannot put two ranks on one GPU), so with fewer than 2
    GPUs every command of the lesson runs on 2 CPU processes over gloo, at CPU sizes; on a 1-GPU host the GPU
    is hidden from them (CUDA_VISIBLE_DEVICES=""), as lesson 7 did first. Single-process parts follow too: a
    lesson compares them with the multi-rank ones, and one command (`lab memory --measure`, `lab bench
    scaling`) often runs both."""

    gpus: int  # CUDA devices this machine shows
    ranks: int  # processes of a multi-rank part: every GPU, or 2 on the CPU
    gpu: bool  # the commands run on GPUs, at GPU sizes (the `workshop-gpu` config)
    env: dict[str, str]  # added to every command's environment by run() and start()
    why: str  # one line for the lesson's first cell
    leased: int = 0  # GPUs each of the lesson's GPU commands leases from the room's queue (0: none, its own)

    @property
    def config(self) -> str:
        """The training config at this plan's sizes."""
        return "workshop-gpu" if self.gpu else "smoke"


def visible_gpus() -> int:
    """CUDA devices torch can use here ($LAB_LESSON_FAKE_GPUS in the tests)."""
    fake = os.environ.get(FAKE_GPUS_ENV)
    if fake not in (None, ""):
        return int(fake)
    return cores.gpu_count()


def plan(gpus: int | None = None, queue: bool = True) -> Plan:
    """The one decision every lesson's first cell makes: how many ranks, on GPUs or CPU processes, for `gpus`
    (default: the GPUs this machine shows). A seat of fewer than 2 GPUs in a room with a GPU queue
    (lab.run.cluster.gpu_queue) runs its lesson's commands on 2 GPUs leased from it, one command at a time;
    `queue=False` keeps this kernel's lesson off the queue from then on, for every command it runs (lesson 7's two
    "nodes" run in the background for minutes).

    >>> p = plan(gpus=1); (p.ranks, p.gpu, p.env, p.config)
    (2, False, {'CUDA_VISIBLE_DEVICES': ''}, 'smoke')
    >>> p = plan(gpus=8); (p.ranks, p.gpu, p.env, p.config)
    (8, True, {}, 'workshop-gpu')
    >>> p = plan(gpus=0); (p.ranks, p.gpu, p.env)
    (2, False, {})
    """
    gpus = visible_gpus() if gpus is None else gpus
    ranks = cores.default_ranks(gpus, fewest_gpus=2)
    if gpus >= 2:
        return Plan(gpus, ranks, True, {}, f"{gpus} GPUs: one process per GPU (NCCL), GPU sizes")
    global _off_the_queue
    _off_the_queue = _off_the_queue or not queue
    if not _off_the_queue and gpu_queue.configured() is not None:
        return Plan(
            gpus,
            QUEUE_RANKS,
            True,
            {},
            f"the room's GPU queue: each of this lesson's runs leases {QUEUE_RANKS} whole GPUs from it (NCCL, GPU "
            "sizes), waiting its turn, and gives them back when it ends",
            leased=QUEUE_RANKS,
        )
    if gpus == 1:
        return Plan(
            1,
            ranks,
            False,
            {"CUDA_VISIBLE_DEVICES": ""},
            "1 GPU: a multi-rank part needs a device per rank, so this lesson runs 2 CPU processes (gloo) "
            "at CPU sizes, with the GPU hidden from its commands (CUDA_VISIBLE_DEVICES=)",
        )
    return Plan(0, ranks, False, {}, f"no GPU: {ranks} CPU processes (gloo), CPU sizes")


def on_gpu() -> bool:
    """True when the lesson's commands run on GPUs (2 or more), at GPU sizes: plan().gpu."""
    return plan().gpu


def devices() -> int:
    """How many processes a lesson's DDP runs use: plan().ranks (every GPU, or 2 CPU processes)."""
    return plan().ranks


def output_dir(lesson: str, root: str | os.PathLike | None = None, fresh: bool = True) -> Path:
    """The lesson's own folder under runs/lessons/, emptied first (fresh) so a rerun shows its own results."""
    global _folder
    folder = Path(root or runs_root()) / lesson
    if fresh and folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if fresh:  # the lesson (re)starts here: its checks are recorded from now on (lab.course.records)
        _folder = folder.resolve()
        records.begin(_folder, lesson)
    return folder.resolve()


def runs_root() -> Path:
    """Where the lessons write: LAB_LESSON_RUNS (a room's seat has it), else runs/lessons/ in the checkout."""
    return records.lesson_runs(checkout() / "runs" / "lessons")


def command_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a command a lesson starts: this kernel's, the plan's (the GPU hidden on a 1-GPU host),
    then the cell's own `env`. LAB_LESSON_RUNS is always set, so what a command records for the room (an
    exercise's checks) lands beside the lessons' runs whatever folder the kernel started in."""
    return {**os.environ, ROOT_ENV: str(runs_root()), **plan().env, **(env or {})}


def start(args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start a command in the background, its output (stderr folded in) on a pipe, with command_env(env); in a
    process group of its own that runner.stop_group() stops, and that is stopped when the kernel exits."""
    return runner.start(args, env=command_env(env))


QUEUE_RANKS = 2  # the GPUs a lesson's command leases from the room's queue (DDP's smallest world)
# The lab commands that run on the GPUs (a lesson's `lab memory` runs only with --measure); `lab exercise check`
# leases its own for each run, and `lab report`, `lab choose`, `lab hang` use none.
GPU_COMMANDS = ("train", "bench", "launch", "predict", "pitfall", "workshop", "rerun")


def uses_gpus(args: Sequence[str]) -> bool:
    """Whether a lesson's command runs on the GPUs: a lab command that trains or measures.

    >>> uses_gpus(["python", "-m", "lab", "train", "--config", "smoke"]), uses_gpus(["python", "-m", "lab", "report"])
    (True, False)
    >>> uses_gpus(["python", "-m", "lab", "memory", "--measure"]), uses_gpus(["python", "-m", "lab", "exercise"])
    (True, False)
    >>> uses_gpus(["python", "-m", "lab", "predict", "--validate"])
    False
    """
    found = [i for i in range(len(args) - 2) if args[i] == "-m" and args[i + 1] == "lab"]
    if not found:
        return False
    command = args[found[0] + 2]
    if command == "predict" and "--validate" in args:  # published inputs alone: nothing runs
        return False
    return command in GPU_COMMANDS or (command == "memory" and "--measure" in args)


@contextlib.contextmanager
def gpus_from_the_queue(count: int) -> Iterator[gpu_queue.Lease | None]:
    """`count` GPUs from the room's queue for one command (None for 0), said in the cell with the wait."""
    if not count:
        yield None
        return
    print(f"(waiting for {count} GPUs from the room's queue ...)", flush=True)
    with gpu_queue.lease(count) as leased:
        if leased is None:
            raise NotWhatYouShouldSee(
                f"the room's queue has fewer than {count} GPUs: ask the instructor (lab room plan --queue-gpus)"
            )
        print(f"({leased.said})", flush=True)
        yield leased


def run(*args: str, check: bool = True, env: dict[str, str] | None = None, gpus: bool | None = None) -> Finished:
    """Run a command, print its output as it comes (stderr folded in), and return it; `check`: a failure stops
    the cell with the command's exit code and its last lines. Interrupting the kernel stops the command's whole
    process group (torchrun and its workers) before the cell stops. Where the plan leases GPUs from the room's
    queue, a command that runs on GPUs (`gpus`, default uses_gpus) runs on GPUs leased for it alone."""
    print(f"$ {' '.join(args)}", flush=True)
    lines: list[str] = []

    def show(line: str) -> None:
        print(line, end="", flush=True)
        lines.append(line)

    on_gpus = uses_gpus(args) if gpus is None else gpus
    if (env or {}).get("CUDA_VISIBLE_DEVICES") == "":  # the cell hides every GPU from it: a CPU run, leasing none
        on_gpus = False
    with gpus_from_the_queue(plan().leased if on_gpus else 0) as leased:
        command, full_env = list(args), command_env(env)
        if leased is not None:
            command, full_env = gpu_queue.on_leased(leased, command, full_env)
        done = runner.run(
            command, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, each_line=show, echo=False
        )
    if check and done.returncode != 0:
        tail = "".join(lines[-15:])
        _record(Check(f"{' '.join(args)}", FAILED, f"exited {done.returncode}"))
        raise NotWhatYouShouldSee(f"{' '.join(args)} exited {done.returncode}; its last lines:\n{tail}")
    return Finished(args, done.returncode, "".join(lines), None)


def lab(*args: str, check: bool = True, env: dict[str, str] | None = None, gpus: bool | None = None) -> Finished:
    """`lab ARGS`, with this kernel's Python (the lab installed beside it); `gpus` as run() takes it."""
    return run(sys.executable, "-m", "lab", *args, check=check, env=env, gpus=gpus)


def results(path: str | os.PathLike) -> dict:
    """A JSON result a command wrote (`--json`, a run's metrics)."""
    return json.loads(Path(path).read_text())


def show(path: str | os.PathLike) -> None:
    """Show a PNG plot or a Markdown table a command wrote, inline in the notebook."""
    from IPython.display import Image, Markdown, display

    path = Path(path)
    display(Image(filename=str(path)) if path.suffix == ".png" else Markdown(path.read_text()))


def table(rows: list[dict], columns: list[str]) -> None:
    """Show rows (dicts) as a Markdown table of the named columns."""
    from IPython.display import Markdown, display

    def cell(value: object) -> str:
        return f"{value:.4g}" if isinstance(value, float) else str(value)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(r.get(c, "")) for c in columns) + " |" for r in rows]
    display(Markdown("\n".join(lines)))


def expect(condition: bool, what_you_should_see: str) -> None:
    """The end of a lesson: the result the learner should see, checked (and recorded in the lesson's
    checks.json, which a workshop room's instructor reads); a failure stops the notebook loudly."""
    _record(Check(what_you_should_see, HELD if condition else FAILED, ""))
    if not condition:
        raise NotWhatYouShouldSee(what_you_should_see)
    print(f"as expected: {what_you_should_see}")


def _record(check: Check) -> None:
    if _folder is not None:
        records.append(_folder, check)


# ----------------------------------------------------------------------------- "your turn": the exercises


def exercise_file(name: str) -> Path:
    """Where the learner's work on exercise `name` lives: exercises/NAME.py in the checkout (a seat's home)."""
    return checkout() / "exercises" / f"{name.replace('-', '_')}.py"


def exercise(name: str) -> Path:
    """`lab exercise start NAME`: the starter copied to exercise_file(name) unless the learner's work is there
    already (it is never overwritten); says where to open it."""
    path = exercise_file(name)
    lab("exercise", "start", name, "--dir", str(path.parent))
    print(f"open it in JupyterLab's file browser: {path.relative_to(checkout())}")
    return path


def check_exercise(name: str) -> dict:
    """`lab exercise check NAME FILE`: the learner's file run under torchrun, watched, and its checklist shown.
    The outcome is the learner's, not the lesson's: it is recorded for the room (runs/lessons/exercises/) and
    returned, and a failing check does not stop the notebook (the checklist says what to change)."""
    path = exercise_file(name)
    lab("exercise", "check", name, str(path), check=False)
    found = records.read_exercises(runs_root()).get(name)
    return found or {"kind": "exercise", "name": name, "verdict": NOT_RUN, "checks": []}
