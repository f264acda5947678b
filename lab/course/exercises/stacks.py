"""Where a watched rank's main thread is, asked from outside: the line of a rank that "never came" to a collective
even when it is blocked inside torch's C++ (DDP's forward rebuilding its buckets, a collective torch calls from C++),
where no Python runs and the observer's own records and SIGTERM handler see nothing.

The observer arms Python's faulthandler on SIGWINCH (`arm`): its handler is C, so it writes every thread's stack to
`rank-R.stacks` whatever the thread is blocked in. The grader, when it stops a stalled run, first sends SIGWINCH to
each rank (`ask`), then reads the main thread's innermost line in the learner's file (`where`), with the torch
function it was inside.

>>> text = '''main thread 0x00007f00000000aa
... learner /home/me/convert.py
... Thread 0x00007f00000000bb (most recent call first):
...   File "/usr/lib/python3.11/threading.py", line 324 in wait
...
... Current thread 0x00007f00000000aa (most recent call first):
...   File "/site-packages/torch/nn/parallel/distributed.py", line 1410 in _pre_forward
...   File "/site-packages/torch/nn/parallel/distributed.py", line 1640 in forward
...   File "/site-packages/torch/nn/modules/module.py", line 1750 in _call_impl
...   File "/home/me/convert.py", line 85 in _run_batch
...   File "/home/me/convert.py", line 97 in _run_epoch
... '''
>>> where(text)
"convert.py:85 in _run_batch, inside torch's DistributedDataParallel._pre_forward"
"""

from __future__ import annotations

import faulthandler
import os
import re
import signal
import sysconfig
import threading
import time
from pathlib import Path
from typing import IO

from lab.run.cluster import fault

# SIGWINCH, whose default action is to be ignored: a rank that has not armed the handler yet, or has dropped it in
# its interpreter's shutdown (faulthandler restores the default there), is left alone. SIGUSR1's default would end
# such a process, and so change the run it asked about.
ASK = signal.SIGWINCH
HERE = os.path.dirname(__file__)  # the observer's own frames (runpy's call of the learner's file) are not a place
STDLIB = sysconfig.get_paths()["stdlib"]
ANSWER_SECONDS = 2.0  # how long the grader waits for the ranks' stacks (each is written within milliseconds)
_kept: list[IO[str]] = []  # the file faulthandler writes to stays open as long as the process
# torch's files a rank can be blocked in, named as a learner knows them
TORCH_PLACES = {
    "nn/parallel/distributed.py": "DistributedDataParallel",
    "distributed/distributed_c10d.py": "torch.distributed",
    "autograd/__init__.py": "autograd",
    "_tensor.py": "Tensor",
}


def path(folder: Path | str, rank: int) -> Path:
    return Path(folder) / f"rank-{rank}.stacks"


def arm(folder: str, rank: int, learner_file: str | None) -> None:
    """From now on SIGWINCH writes this rank's stacks beside its trace (unless the learner's program handles it)."""
    if signal.getsignal(ASK) != signal.SIG_DFL:
        return
    stream = path(folder, rank).open("w")
    stream.write(f"main thread 0x{threading.main_thread().ident or 0:016x}\nlearner {learner_file or ''}\n")
    stream.flush()
    faulthandler.register(ASK, file=stream, all_threads=True)
    _kept.append(stream)


def ask(folder: Path, pids: dict[int, int]) -> None:
    """Ask each rank (rank: pid) for its stacks and wait for their answers, ANSWER_SECONDS at most."""
    sizes = {}
    for rank, pid in pids.items():
        target = path(folder, rank)
        if not target.exists():  # not armed (the learner's own SIGWINCH handler): the signal would do what they chose
            continue
        sizes[rank] = target.stat().st_size
        try:
            os.kill(pid, ASK)
        except OSError:  # gone already
            sizes.pop(rank)
    deadline = time.monotonic() + ANSWER_SECONDS
    while sizes and time.monotonic() < deadline:
        sizes = {r: s for r, s in sizes.items() if path(folder, r).stat().st_size == s}
        time.sleep(0.05)
    time.sleep(0.1)  # a dump seen growing is finished within this


def read(folder: Path, rank: int) -> str | None:
    try:
        return where(path(folder, rank).read_text(errors="replace"))
    except OSError:
        return None


def where(text: str) -> str | None:
    """The main thread's innermost line in the learner's file (else in the grader's own code that calls it, a
    probe), with the torch function it was inside; None where the rank was never asked."""
    main = re.match(r"main thread (0x[0-9a-f]+)\nlearner (.*)\n", text)
    if not main:
        return None
    learner = os.path.realpath(main[2]) if main[2] else None
    frames = fault.main_thread_frames(text, main[1])
    inside, fallback = None, None
    for file, lineno, function in frames:  # innermost first
        at = f"{os.path.basename(file)}:{lineno} in {function}"
        if learner and os.path.realpath(file) == learner:
            return f"{at}, inside torch's {inside}" if inside else at
        if "/torch/" in file:
            name = next((n for tail, n in TORCH_PLACES.items() if file.endswith("/torch/" + tail)), None)
            inside = inside or (f"{name}.{function}" if name else None)
        elif fallback is None and os.path.dirname(file) != HERE and not file.startswith((STDLIB, "<")):
            fallback = f"{at}, inside torch's {inside}" if inside else at
    return fallback
