"""Anyone's script watched for hangs, with no change to it: `lab launch -- SCRIPT.py ARGS` runs each worker as
`python -m lab.run.cluster.watched --hang-seconds S --stop-seconds T -- SCRIPT.py ARGS`.

Before the script runs, the collectives' record is switched on (lab.run.cluster.flight: torch's Flight Recorder, or
the lab's own where torch has none) and `torch.distributed.init_process_group` is wrapped so that, once the script's
own group exists, each rank starts the lab's watchdog (lab.run.cluster.watchdog): the same thread that watches `lab
train`, which samples the main thread's Python frame, so a rank stuck outside any collective (asleep in its data
loading, in a long loop) is named with its line, and a rank waiting in a collective with the collective and its line.
The script is then run as `python SCRIPT.py` would run it (runpy: `__main__`, its own argv, its folder first on
sys.path).

A named stall is not ended at once: a rank may be legitimately slow while the others wait in a barrier (rank 0 saving
a checkpoint). The rank that named it ends the run when the same stall has lasted `stop_seconds` more: every rank
that shares the folder records itself and exits (watchdog.STOPPED_EXIT), and `lab launch` says the diagnosis again
(lab.run.cluster.hang.say_after_failure). Without it a plain `init_process_group` waits 30 minutes (gloo) or 10
(NCCL) before torch itself gives up.
"""

from __future__ import annotations

import argparse
import os
import runpy
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lab import frozen_imports

frozen_imports.leave_alone()  # anyone's script is __main__ here: its globals finalised at exit, as by python

MODULE = "lab.run.cluster.watched"


def wrap(target: list[str], hang_seconds: float, stop_seconds: float) -> list[str]:
    """The torchrun target that runs `target` (SCRIPT ARGS or -m MODULE ARGS) watched.

    >>> wrap(["stuck.py", "--n", "3"], 30, 300)
    ['-m', 'lab.run.cluster.watched', '--hang-seconds', '30', '--stop-seconds', '300', '--', 'stuck.py', '--n', '3']
    """
    return ["-m", MODULE, "--hang-seconds", f"{hang_seconds:g}", "--stop-seconds", f"{stop_seconds:g}", "--", *target]


def is_lab(target: list[str]) -> bool:
    """The lab's own programs (`-m lab ...`, `-m lab.x.y`) watch themselves (lab.run.cluster.dist: the config's
    dist.hang_seconds); a second watchdog would only say it twice.

    >>> is_lab(["-m", "lab", "train"]), is_lab(["-m", "lab.course.pitfalls.planted_hang"]), is_lab(["lab.py"])
    (True, True, False)
    """
    return target[:1] == ["-m"] and len(target) > 1 and (target[1] == "lab" or target[1].startswith("lab."))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}")
    parser.add_argument("--hang-seconds", type=float, default=30.0)
    parser.add_argument("--stop-seconds", type=float, default=300.0)
    parser.add_argument("target", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    target = args.target[1:] if args.target[:1] == ["--"] else args.target
    if not target:
        parser.error("nothing to run: -- SCRIPT.py ARGS or -- -m MODULE ARGS")
    from lab.run.cluster import fault, flight, hang

    flight.enable()  # before the script's first group: the Flight Recorder reads its buffer size once
    folder = os.environ.get(hang.FOLDER_ENV)
    if folder and args.hang_seconds > 0:
        fault.arm(Path(folder) / hang.SNAPSHOTS, int(os.environ.get("RANK", "0")))
    watching = _watch_groups(args.hang_seconds, args.stop_seconds)
    try:
        if target[0] == "-m":
            sys.argv = [target[1], *target[2:]]
            runpy.run_module(target[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(target)
            sys.path.insert(0, os.path.dirname(os.path.abspath(target[0])))
            runpy.run_path(target[0], run_name="__main__")
    except BaseException as exc:
        if watching and not (isinstance(exc, SystemExit) and exc.code in (0, None)):
            # the collective it raised in is the one it was in (the recorder counts it completed); a stall's
            # record, written earlier, says more and is kept
            in_collective = any("torch/distributed" in f.filename for f in traceback.extract_tb(exc.__traceback__))
            # torchrun's SIGTERM (another rank failed too) would end the process inside the write: held until it
            # is done, then delivered (CI lost a rank's record that way)
            held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
            try:
                watching[0].dump(f"raised {type(exc).__name__}", overwrite=False, failed=in_collective)
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, held)
        raise


def _watch_groups(hang_seconds: float, stop_seconds: float) -> list[Any]:
    """init_process_group, then this rank's watchdog (once, for the default group of more than one rank)."""
    import torch.distributed as tdist
    import torch.distributed.distributed_c10d as c10d

    original = c10d.init_process_group
    started: list[Any] = []

    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        if not started and hang_seconds > 0 and tdist.get_world_size() > 1:
            from lab.run.cluster import watchdog

            rank, world = tdist.get_rank(), tdist.get_world_size()
            watch = watchdog.Watchdog(rank, world, hang_seconds, knob="--hang-seconds")
            watch.on_diagnosis = _stop_later(watch, stop_seconds)
            started.append(watch.start())
        return result

    init_process_group.__wrapped__ = original  # type: ignore[attr-defined]
    tdist.init_process_group = init_process_group  # `dist.init_process_group(...)`, the usual spelling
    c10d.init_process_group = init_process_group  # `from torch.distributed.distributed_c10d import ...`
    return started


def _stop_later(watch: Any, stop_seconds: float) -> Callable[[dict[str, Any]], None]:
    """After a diagnosis: end every rank if this one's main thread is still where it stalled `stop_seconds` later."""
    from lab.run.cluster import watchdog

    def stop(diagnosis: dict[str, Any]) -> None:
        where = watchdog.main_position()

        def later() -> None:
            time.sleep(stop_seconds)
            if watchdog.main_position() != where:
                return  # it moved on: a slow rank, not a hang
            print(
                f"lab: rank {watch.rank} ends the run: the hang named above still stands {stop_seconds:g} s later "
                f"(--stop-seconds)",
                file=sys.stderr,
                flush=True,
            )
            watch.stop_every_rank()
            time.sleep(2 * watchdog.POLL_SECONDS)  # the others first: their collectives see no closed connection
            watch.dump("ended the run with the hang named above", overwrite=False)
            os._exit(watchdog.STOPPED_EXIT)

        if stop_seconds > 0:
            threading.Thread(target=later, name="lab-hang-stop", daemon=True).start()

    return stop


if __name__ == "__main__":
    main()
