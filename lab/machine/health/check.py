"""One health check's outcome: its name, its status (lab.machine.health.status) and what to do about it. `lab doctor`
prints it as a line; `lab validate` keeps it in validate.json as a record."""

from __future__ import annotations

from dataclasses import dataclass

from lab.machine.health.status import OK


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # one of lab.machine.health.status.STATUSES
    detail: str
    fix: str = ""  # what to do about anything but ok

    def line(self) -> str:
        """
        >>> Check("shm", "warn", "/dev/shm is 64 MiB", "run containers with --ipc host").line()
        'warn  shm        /dev/shm is 64 MiB; run containers with --ipc host'
        """
        text = f"{self.status:<5} {self.name:<10} {self.detail}"
        return f"{text}; {self.fix}" if self.fix and self.status != OK else text

    def record(self) -> dict[str, str]:
        """validate.json's form: {name, status, detail}.

        >>> Check("xid", "fail", "2 XID(s) since boot: 79, 48").record()["status"]
        'fail'
        """
        return {"name": self.name, "status": self.status, "detail": self.detail}
