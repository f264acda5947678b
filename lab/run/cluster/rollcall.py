"""Counting the nodes that reached a multi-node rendezvous, so a join timeout can say how many arrived.

torchrun's c10d rendezvous gives up with a bare `RendezvousTimeoutError`. Every node's
launcher therefore also connects to the store torchrun serves at the rendezvous endpoint
and adds itself to a counter there, polling it until the expected nodes have arrived. When the
rendezvous fails, the last count seen is what the launcher reports.

The observer is a child process (`python -m lab.run.cluster.rollcall HOST PORT KEY TIMEOUT EXPECTED`) printing each
count it sees, not a thread of the launcher: a TCPStore call blocks in C++ for up to its timeout, and a
launcher whose interpreter exits while a thread is inside one dies of `terminate called without an active
exception` (SIGABRT) instead of returning torchrun's status and its one-line reason. A child is stopped
cleanly at any moment; its stderr (c10d's connection warnings and their C++ frames) is left out of the log.

It stops polling once `expected` nodes arrived: past that the count tells nothing, and a poll that
outlives the head's torchrun (which owns the store) only ends in a c10d warning.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from datetime import timedelta


class RollCall:
    """Background observer of one rendezvous: `arrived` counts the launchers that reached the rendezvous
    store (each adds itself once), None until this one did."""

    def __init__(self, host: str, port: int, run_id: str, timeout_s: float, expected: int):
        self.command = [
            sys.executable,
            "-m",
            "lab.run.cluster.rollcall",
            host,
            str(port),
            f"lab/roll_call/{run_id}",
            str(timeout_s),
            str(expected),
        ]
        self.arrived: int | None = None
        self._child: subprocess.Popen | None = None
        self._reader: threading.Thread | None = None

    def start(self) -> RollCall:
        self._child = subprocess.Popen(self.command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self._reader = threading.Thread(target=self._read, name="lab-roll-call", daemon=True)
        self._reader.start()
        return self

    def _read(self) -> None:
        assert self._child is not None and self._child.stdout is not None  # start() began it, stdout a PIPE
        for line in self._child.stdout:  # ends when the child exits: pure Python, safe to leave at any time
            self.arrived = int(line)

    def stop(self) -> None:
        assert self._child is not None and self._reader is not None, "RollCall.stop() before start()"
        if self._child.poll() is None:
            self._child.terminate()
        self._child.wait()
        self._reader.join(timeout=5)


def watch(host: str, port: int, key: str, timeout_s: float, expected: int) -> None:
    """The child's loop: join the count once, then print it each second until `expected` arrived."""
    from torch.distributed import TCPStore

    try:
        # A client only: the head's torchrun owns the server. It may not be up yet; the client retries
        # until timeout_s, the same bound torchrun's own connection has.
        store = TCPStore(host, port, is_master=False, timeout=timedelta(seconds=timeout_s))
        arrived = store.add(key, 1)
        print(arrived, flush=True)
        while arrived < expected:
            time.sleep(1.0)
            arrived = store.add(key, 0)
            print(arrived, flush=True)
    except Exception:
        return


if __name__ == "__main__":
    host, port, key, timeout_s, expected = sys.argv[1:]
    watch(host, int(port), key, float(timeout_s), int(expected))
