"""Counting the nodes that reached a multi-node rendezvous, so a join timeout can say how many arrived.

torchrun's c10d rendezvous gives up with a bare `RendezvousTimeoutError`. Every node's
launcher therefore also connects to the store torchrun serves at the rendezvous endpoint
and adds itself to a counter there, polling it until the expected nodes have arrived. When the
rendezvous fails, the last count seen is what the launcher reports.

It stops polling once `expected` nodes arrived: past that the count tells nothing, and a poll that
outlives the head's torchrun (which owns the store) ends in c10d's "recvValue failed" warning with a
page of C++ frames in a launch log whose run succeeded.
"""

from __future__ import annotations

import threading
from datetime import timedelta


class RollCall:
    """Background observer of one rendezvous: `arrived` counts the launchers that reached the rendezvous
    store (each adds itself once), None until this one did."""

    def __init__(self, host: str, port: int, run_id: str, timeout_s: float, expected: int):
        self.host, self.port = host, port
        self.expected = expected
        self.key = f"lab/roll_call/{run_id}"
        self.timeout_s = timeout_s
        self.arrived: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="lab-roll-call", daemon=True)

    def start(self) -> "RollCall":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)

    def _watch(self) -> None:
        from torch.distributed import TCPStore

        try:
            # A client only: the head's torchrun owns the server. It may not be up yet; the client retries
            # until timeout_s, the same bound torchrun's own connection has.
            store = TCPStore(self.host, self.port, is_master=False, timeout=timedelta(seconds=self.timeout_s))
            self.arrived = store.add(self.key, 1)
            while self.arrived < self.expected and not self._stop.wait(1.0):
                self.arrived = store.add(self.key, 0)
        except Exception:  # noqa: BLE001 - an observer: the store going away (torchrun ended) ends the watch
            return
