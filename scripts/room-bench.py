#!/usr/bin/env python3
"""How many seats of a room this host holds running lesson 1 at once: a real room (`lab room serve`, the local
spawner, real seats as system users), lesson 1 run in one seat alone, then in N seats at the same time, each in
its own kernel; for each N the wall time, its ratio to one seat alone, whether every seat's checks held, and the
seats' peak memory (PSS summed over each seat's processes).

    .venv/bin/python scripts/room-bench.py --seats 1,3,6        # as root (the seats are system users)

Seats bench1..benchN are made for the run and deleted after it. They must reach the lab's Python: where a folder
on the way is closed (a checkout under /root), the room refuses in one line and so does this script; open it for
search (`chmod o+x`) for the run, as tests/infra/test_room.py does. Numbers: BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import os
import pwd
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lab.course.room import seats as room_seats  # noqa: E402
from lab.course.room.serve import stop_user_processes  # noqa: E402
from lab.course.teaching.lesson import free_ports  # noqa: E402
from tests.infra import hub_client as hub  # noqa: E402

LESSON = "notebooks/01_baseline_and_ddp.ipynb"


def run_at_once(seats: list[hub.Seat]) -> tuple[float, int, dict[str, int]]:
    """Lesson 1 in every seat at once: wall seconds, seats whose one check held, peak PSS per seat."""
    for seat in seats:
        seat.start()
        for folder in (Path(pwd.getpwnam(seat.name).pw_dir) / "runs" / "lessons").glob("*"):
            subprocess.run(["rm", "-rf", str(folder)], check=True)
    results: dict[str, list[dict] | BaseException] = {}  # each seat's cell outputs, or what its run raised

    def one(seat: hub.Seat) -> None:
        try:
            results[seat.name] = seat.run_notebook(LESSON, timeout=1800)
        except BaseException as exc:
            results[seat.name] = exc

    with hub.PeakMemory([s.name for s in seats]) as memory:
        started = time.monotonic()
        threads = [threading.Thread(target=one, args=(s,)) for s in seats]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.monotonic() - started
    held = sum(
        1
        for r in results.values()
        if not isinstance(r, BaseException) and sum(o["stdout"].count("as expected: ") for o in r) == 1
    )
    return wall, held, memory.peaks


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--seats", default="1,3,6", help="seat counts to run at once, the first being 1 (default 1,3,6)"
    )
    args = parser.parse_args()
    counts = [int(n) for n in args.seats.split(",")]
    most = max(counts)
    names = [f"bench{i + 1}" for i in range(most)]
    state = Path(tempfile.mkdtemp(prefix="room-bench-"))
    port = free_ports(3)  # the proxy's public port, the hub's, the proxy's API
    hub_port, api_port = port + 1, port + 2
    serve = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "lab",
            "room",
            "serve",
            "--prefix",
            "bench",
            "--seats",
            str(most),
            "--memory",
            str(4 * most + 4),
            "--room-dir",
            str(state),
            "--port",
            str(port),
            "--hub-port",
            str(hub_port),
            "--proxy-api-port",
            str(api_port),
        ],
        cwd=ROOT,
        stdout=(state.parent / f"{state.name}.log").open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        try:
            hub.wait_until_serving(base, serve, state.parent / f"{state.name}.log")
            admin, password = (state / "instructor-password").read_text().split()
            instructor = hub.log_in(base, admin, password)
            assert instructor is not None, f"{admin}: the hub refused the instructor's log-in"
            seats = [hub.admit(base, instructor, name, f"{name}-bench-passphrase") for name in names]
        except AssertionError as exc:
            raise SystemExit(str(exc)) from None
        print(f"{os.cpu_count()} cores; lesson 1 in N seats at once (each its own kernel and runs)")
        print("| seats at once | wall s | vs 1 seat | seats whose checks held | peak PSS per seat (GiB) |")
        print("|---:|---:|---:|---:|---|")
        alone = None
        for count in counts:
            wall, held, peaks = run_at_once(seats[:count])
            alone = alone or wall
            print(
                f"| {count} | {wall:.0f} | {wall / alone:.2f}x | {held}/{count} | "
                f"{', '.join(f'{v / 2**30:.2f}' for _, v in sorted(peaks.items()))} |",
                flush=True,
            )
    finally:
        if serve.poll() is None:  # a room that refused to start has exited already
            os.killpg(serve.pid, signal.SIGTERM)
        serve.wait(timeout=120)
        for name in names:
            if room_seats.made_by_a_room(name):
                stop_user_processes(name)
                room_seats.remove_user(name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
