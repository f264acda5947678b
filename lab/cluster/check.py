"""One line of `lab doctor`: a check's name, its status and what to do about it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # "ok", "warn" or "fail"
    detail: str
    fix: str = ""  # what to do about a warn or fail

    def line(self) -> str:
        """
        >>> Check("shm", "warn", "/dev/shm is 64 MiB", "run containers with --ipc host").line()
        'warn  shm        /dev/shm is 64 MiB; run containers with --ipc host'
        """
        text = f"{self.status:<5} {self.name:<10} {self.detail}"
        return f"{text}; {self.fix}" if self.fix and self.status != "ok" else text
