"""Where a rank was when a fatal signal ended it. gloo aborts a process on a collective mismatch (std::terminate:
SIGABRT), and a process that dies by a signal runs no Python on its way out, so its watchdog writes nothing; Python's
faulthandler, armed before the script runs, writes every thread's stack to `rank-N.fault` beside the ranks' snapshots
(`<folder>/hang/`, lab.run.cluster.hang) from the
signal handler itself, and this module reads the main thread's: the collective it was in (torch.distributed's
function on its stack) and the caller's line.

>>> text = '''main thread 0x00007f00000000aa
... Fatal Python error: Aborted
...
... Thread 0x00007f00000000bb (most recent call first):
...   File "/usr/lib/python3.11/threading.py", line 324 in wait
...
... Current thread 0x00007f00000000aa (most recent call first):
...   File "/site-packages/torch/distributed/distributed_c10d.py", line 3913 in all_reduce
...   File "/site-packages/torch/distributed/c10d_logger.py", line 83 in wrapper
...   File "mismatch.py", line 7 in <module>
... '''
>>> where(text, torch_dir="/site-packages/torch")
'in all_reduce at mismatch.py:7 in <module>'
"""

from __future__ import annotations

import faulthandler
import re
import sysconfig
import threading
from pathlib import Path

from lab.run.cluster import flight

_kept: list[object] = []  # the open file faulthandler writes to lives as long as the process


def path(snapshots: Path, rank: int) -> Path:
    return Path(snapshots) / f"rank-{rank}.fault"


def arm(snapshots: Path, rank: int) -> None:
    """From now on a fatal signal (SIGABRT, SIGSEGV, SIGBUS, SIGFPE, SIGILL) leaves this rank's stacks there."""
    target = path(snapshots, rank)
    target.parent.mkdir(parents=True, exist_ok=True)
    stream = target.open("w")
    stream.write(f"main thread 0x{threading.main_thread().ident or 0:016x}\n")
    stream.flush()
    faulthandler.enable(file=stream, all_threads=True)
    _kept.append(stream)


def read(snapshots: Path, rank: int) -> str | None:
    """'in all_reduce at mismatch.py:7 in <module>' for a rank that died by a signal, None where none did."""
    try:
        text = path(snapshots, rank).read_text(errors="replace")
    except OSError:
        return None
    import torch

    return where(text, str(Path(torch.__file__).parent), flight.NOT_THE_CALLER)


def where(text: str, torch_dir: str, not_the_caller: tuple[str, ...] = ()) -> str | None:
    """The main thread's collective and line in a faulthandler dump (None: no fatal error in it). Frames under
    `not_the_caller` (the lab's own record of collectives on a torch without a Flight Recorder) are passed over."""
    if "Fatal Python error" not in text:
        return None
    main = re.match(r"main thread (0x[0-9a-f]+)", text)
    frames = main_thread_frames(text, main[1]) if main else []
    op = None
    stdlib = sysconfig.get_paths()["stdlib"]
    for file, _line, function in frames:  # innermost first: the public function is the last of torch's own
        if file.startswith(torch_dir) and file.endswith("distributed_c10d.py"):
            op = function
        elif not file.startswith((torch_dir, stdlib, "<", *not_the_caller)):
            caller = f"at {flight.short_path(file)}:{_line} in {function}"
            return f"in {op} {caller}" if op else caller
    return None


def main_thread_frames(text: str, main: str) -> list[tuple[str, int, str]]:
    """(file, line, function) of thread `main` in a faulthandler dump, innermost first; where the dump holds that
    thread more than once (one dump appended per request), its last."""
    frames: list[tuple[str, int, str]] = []
    current: str | None = None
    for line in text.splitlines():
        header = re.match(r"^(?:Current thread|Thread) (0x[0-9a-f]+)", line)
        if header:
            current = header[1]
            if current == main:
                frames = []
            continue
        frame = re.match(r'^\s+File "(.+)", line (\d+) in (.+)$', line)
        if frame and current == main:
            frames.append((frame[1], int(frame[2]), frame[3]))
    return frames
