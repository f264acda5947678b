"""Output piped into a reader that stops early (`| head`, `| less` quit, `| grep -m1`): stop writing, quietly.

Python ignores SIGPIPE, so a write to a pipe whose reader has gone raises BrokenPipeError, and the interpreter's
own flush at exit prints "Exception ignored ... BrokenPipeError" after it. A command that meets it points its
standard output at /dev/null (nothing more reaches the reader, and the exit flush has nowhere to fail) and ends
as a shell expects a command that lost its reader: status 141 (128 + SIGPIPE), no traceback. The children the
command started still stop with it: the exception unwinds through their runner like any other.
"""

from __future__ import annotations

import os
import signal
import sys

EXIT_BROKEN_PIPE = 128 + signal.SIGPIPE


def silence_stdout() -> None:
    """From now on this process's standard output goes nowhere (its reader closed the pipe)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # no file descriptor behind sys.stdout (a test's capture): nothing to point
        pass
