"""What a child printed, read for what matters: the line of a failed job's output that says what went wrong, and
torchrun's stderr without the C++ stacks c10d prints under its warnings."""

from __future__ import annotations

import re
import sys
from typing import IO

# The C++ stack c10d prints under a warning or an error: never the line that says what went wrong.
STACK = re.compile(r"^(Exception raised from .*|frame #\d+: .*|<omitting python frames>|)$")


def last_error_line(output: str) -> str:
    """The line of a failed job's output that says what went wrong: a worker's last exception line (not
    torchrun's own ChildFailedError, which only says that a worker failed, nor a C++ stack frame), else the
    last line.

    >>> last_error_line("ValueError: bad\\n...\\ntorch.distributed.elastic...ChildFailedError: \\nboom FAILED\\n")
    'ValueError: bad'
    >>> last_error_line("RuntimeError: gloo timed out\\nframe #0: c10::Error::Error(...) + 0x9d\\n")
    'RuntimeError: gloo timed out'
    >>> last_error_line("/venv/bin/python: No module named lab.course.pitfalls.nope\\n")
    '/venv/bin/python: No module named lab.course.pitfalls.nope'
    >>> last_error_line("")
    'no output'
    """
    lines = [line.strip() for line in output.splitlines() if line.strip() and not STACK.match(line.strip())]
    errors = [
        line
        for line in lines
        if "ChildFailedError" not in line and re.search(r"\b\w*(Error|Exception)\b:|No module named", line)
    ]
    return ((errors or lines or ["no output"])[-1])[:300]


class StackFolder:
    """Relays torchrun's stderr, leaving out the C++ stack c10d prints under each of its warnings (the warning
    line itself stays). When one node's agent outlives the rendezvous store (hosted by another agent, which
    exits first at the end of every run), closing the rendezvous fails with such a warning and ~20 frames of
    C++ addresses: a page of noise at the end of a log whose run succeeded.

    >>> folder = StackFolder()
    >>> lines = ["[W1201 11:08:44.93 TCPStore.cpp:115] [c10d] recvVector failed on SocketImpl(fd=3): got 0 bytes",
    ...          "Exception raised from recvBytes at Utils.hpp:790 (most recent call first):",
    ...          "frame #0: c10::Error::Error(...) + 0x9d (0x7fcb in libc10.so)", "<omitting python frames>", "",
    ...          "W1201 11:08:44.430000 29708 dynamic_rendezvous.py:1298] The node has failed to shutdown", ""]
    >>> [line for line in lines if folder.keep(line)], folder.warnings, folder.folded
    (['[W1201 11:08:44.93 TCPStore.cpp:115] [c10d] recvVector failed on SocketImpl(fd=3): got 0 bytes', 'W1201
    11:08:44.430000 29708 dynamic_rendezvous.py:1298] The node has failed to shutdown', ''], 1, 4)
    """

    WARNING = re.compile(r"^\[W\d{4} \S+ \S+\] \[c10d\] ")

    def __init__(self, sink: IO[str] | None = None) -> None:
        self.sink = sink  # where relay() writes the lines kept
        self.warnings = 0  # c10d warnings seen
        self.folded = 0  # stack lines left out
        self._under_warning = False
        self._held: list[str] = []  # a traceback of torchrun's own, until its last line

    def keep(self, line: str) -> bool:
        if self.WARNING.match(line):
            self.warnings += 1
            self._under_warning = True
            return True
        if self._under_warning and STACK.match(line):
            self.folded += 1
            return False
        self._under_warning = False
        return True

    def relay(self, line: str) -> None:
        """One line of the child's stderr (with its newline) to the sink, unless it is a folded stack line or in
        the traceback torchrun prints of its own stop by a signal (SignalException: Ctrl-C, or the lab's own stop
        of a run that hung), which says nothing the lab does not say better. A traceback is held until its last
        line says which it is."""
        text = line.rstrip("\n")
        if self._held:
            self._held.append(line)
            if text.startswith((" ", "\t")):
                return
            held, self._held = self._held, []
            if "SignalException" in text:
                self.folded += len(held)
            else:
                self._write(held)
            return
        if text == "Traceback (most recent call last):":  # torchrun's own; a worker's lines carry [rankN]:
            self._held = [line]
            return
        if self.keep(text):
            self._write([line])

    def flush(self) -> None:
        """What is still held when the child has ended."""
        held, self._held = self._held, []
        self._write(held)

    def _write(self, lines: list[str]) -> None:
        if lines:
            sink = self.sink or sys.stderr
            sink.write("".join(lines))
            sink.flush()
