"""`lab room status`: every seat by lesson (held, failed, running, not run), each seat's newest run and the
memory its GPUs hold, then every seat by exercise (held, failed with the check that failed, not run), read from
the seats' homes (their lessons' and exercises' records, lab.course.records, and run directories) and NVML.

    | seat | 01 | 02 | ... | newest run | memory |
    | seat1 | held 1/1 | not run | ... | ddp-2 (completed) | no GPU; rank 0 held 0.7 GiB |

    | seat | convert | fix-set-epoch | ... |
    | seat1 | failed: each rank its own share of every epoch | not run | ... |

Run it as root (or the user who owns the seats' homes): each home is closed to everyone else. The Grafana
dashboard "lab room" shows the same from the Pushgateway, where the room has one.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lab import atomic
from lab.course import records
from lab.course.exercises import EXERCISES
from lab.course.room import plan as room_plan
from lab.course.room import seats
from lab.errors import LabError
from lab.run.cluster import gpu_queue, slurm_gpus

if TYPE_CHECKING:
    from lab.course.room.settings import RoomSettings

GIB = 2**30


def lessons(folder: Path | None = None) -> list[tuple[str, int]]:
    """(number, checks it makes) for each shipped lesson: a lesson holds when all of them held.

    >>> [n for n, _ in lessons()]
    ['01', '02', '03', '04', '05', '06', '07']
    """
    return [(path.name[:2], path.read_text().count("lesson.expect(")) for path in seats.lesson_files(folder)]


def seat_status(seat: room_plan.Seat, home: Path | None, expected: list[tuple[str, int]]) -> dict[str, Any]:
    runs = seats.runs_dir(home) if home else None
    found: dict[str, Any] = {}
    if runs is not None and runs.is_dir():
        try:
            for folder in runs.iterdir():
                record = records.read(folder)
                if record is not None:
                    found[folder.name[:2]] = record
        except PermissionError:
            raise LabError(
                f"{runs}: not readable by this user; run lab room status as root (each seat's home is "
                f"closed to everyone else)"
            ) from None
    run = newest_run(runs) if runs is not None and runs.is_dir() else None
    tried = records.read_exercises(runs) if runs is not None and runs.is_dir() else {}
    return {
        "seat": seat.name,
        "devices": list(seat.devices),
        "lessons": {n: records.cell(found.get(n), count) for n, count in expected},
        "checks": {n: found[n]["checks"] for n in found},
        "exercises": {name: records.cell(tried.get(name)) for name in EXERCISES},
        "run": run,
        "memory": memory_text(seat, run),
    }


def newest_run(runs: Path) -> dict[str, Any] | None:
    """The seat's most recently started run: its id, status (running until its summary is written) and rank 0's
    memory (device memory on a GPU, resident memory on a CPU): its peak once finished, else its last logged."""
    manifests = sorted(runs.rglob("manifest.json"), key=lambda p: p.stat().st_mtime)
    if not manifests:
        return None
    folder = manifests[-1].parent
    summary = _json(folder / "summary.json") or {}
    held = summary.get("device_memory_peak_bytes")  # a finished run's peak; a running one's last logged figure
    metrics = folder / "metrics.jsonl"
    if held is None and metrics.exists():
        for line in reversed(metrics.read_text().splitlines()):
            row = json.loads(line) if line.strip() else {}
            if "device_memory_allocated_bytes" in row:
                held = row["device_memory_allocated_bytes"]
                break
    return {
        "run_id": folder.name,
        "path": str(folder),
        "status": summary.get("status", "running"),
        "memory_bytes": held,
    }


def memory_text(seat: room_plan.Seat, run: dict[str, Any] | None) -> str:
    """What the seat's GPUs hold now (NVML), or on a seat without GPUs what its newest run's rank 0 held."""
    used = gpu_memory_used(seat.devices)
    if used is not None:
        return f"{used / GIB:.1f} GiB on GPU {seat.cuda_visible_devices}"
    held = (run or {}).get("memory_bytes")
    where = "no GPU" if not seat.devices else f"GPU {seat.cuda_visible_devices} (no NVML here)"
    return f"{where}; its newest run's rank 0: {held / GIB:.2f} GiB" if held else where


def gpu_memory_used(devices: tuple[str, ...]) -> int | None:
    """Bytes in use on these GPUs (host indices or UUIDs) by every process, or None without NVML or GPUs."""
    if not devices:
        return None
    try:
        import pynvml

        pynvml.nvmlInit()
        total = 0
        for device in devices:
            handle = (
                pynvml.nvmlDeviceGetHandleByUUID(device)
                if not device.isdigit()
                else pynvml.nvmlDeviceGetHandleByIndex(int(device))
            )
            total += int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)
        return total
    except Exception:
        return None


def _json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def table(rows: list[dict[str, Any]], numbers: list[str]) -> str:
    head = "| seat | " + " | ".join(numbers) + " | newest run | memory |"
    lines = [head, "|---|" + "---|" * len(numbers) + "---|---|"]
    for row in rows:
        run = row["run"]
        newest = f"{run['run_id']} ({run['status']})" if run else "none"
        lines.append(
            f"| {row['seat']} | " + " | ".join(row["lessons"][n] for n in numbers) + f" | {newest} | {row['memory']} |"
        )
    return "\n".join(lines)


def exercise_table(rows: list[dict[str, Any]]) -> str:
    """Each seat's exercises: held, failed (with the first check that failed), or not run.

    >>> print(exercise_table([{"seat": "s1", "exercises": {"convert": "held", "shard": "not run"}}]))
    | seat | convert | shard |
    |---|---|---|
    | s1 | held | not run |
    """
    names = list(rows[0]["exercises"]) if rows else []
    lines = ["| seat | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    lines += [f"| {row['seat']} | " + " | ".join(row["exercises"][n] for n in names) + " |" for row in rows]
    return "\n".join(lines)


def seat_home(name: str, spawner: str) -> Path | None:
    """Where seat `name` keeps its files, as seen from here: its system user's home, or under Docker its volume's
    folder on this host (the Docker engine says where)."""
    if spawner != "docker":
        return seats.home_of(name)
    import docker

    try:
        return Path(docker.from_env().volumes.get(f"lab-room-{name}").attrs["Mountpoint"])
    except docker.errors.NotFound:
        return None  # the seat never started
    except docker.errors.DockerException as exc:
        raise LabError(
            f"lab room status: the seats are Docker volumes and the Docker engine cannot be asked where "
            f"({exc}); run it on the room's host, as root"
        ) from None


def run(args: argparse.Namespace) -> int:
    from lab.course.room.settings import RoomSettings

    state = Path(args.room_dir)
    plan = room_plan.load(state / "plan.json")
    settings = RoomSettings.load(state)
    if not getattr(args, "watch", None):
        draw(args, plan, settings)
        return 0
    clear = "\033[H\033[2J" if sys.stdout.isatty() else ""
    try:
        while True:
            print(f"{clear}lab room status, every {args.watch:g} s (Ctrl-C stops): {time.strftime('%H:%M:%S')}\n")
            draw(args, plan, settings)
            sys.stdout.flush()
            time.sleep(args.watch)
    except KeyboardInterrupt:  # how a watch ends: the last table stays on the screen
        print("\nlab room status: stopped watching", flush=True)
    return 0


def draw(args: argparse.Namespace, plan: room_plan.RoomPlan, settings: RoomSettings) -> None:
    """The room now: every seat by lesson, by exercise, and the queue's GPUs (and the JSON, where asked)."""
    expected = lessons()
    rows = [seat_status(seat, seat_home(seat.name, settings.spawner), expected) for seat in plan.seats]
    print(table(rows, [n for n, _ in expected]))
    print()
    print(exercise_table(rows))
    partition = slurm_gpus.partition_of(settings.gpu_queue)
    held: Any = slurm_gpus.holders(partition) if partition else queue_holders(settings.gpu_queue)
    if held is not None:
        print()
        print(slurm_queue_text(partition, held) if partition else queue_text(held))
    if args.json:
        found: dict[str, Any] = {"seats": rows, **({"gpu_queue": held} if held is not None else {})}
        atomic.write_text(Path(args.json), json.dumps(found, indent=2) + "\n")


def queue_holders(folder: str) -> dict[str, dict[str, Any] | None] | None:
    """Who holds each GPU of the room's queue now; None where the room has no queue."""
    if not folder or not Path(folder).is_dir():
        return None
    return gpu_queue.holders(Path(folder))


def queue_text(held: dict[str, dict[str, Any] | None]) -> str:
    """One line per GPU of the queue: free, or whose check holds it and for how long.

    >>> import time
    >>> print(queue_text({"6": None, "7": {"who": "seat3", "pid": 42, "since": time.time() - 12}}))
    the GPU queue: 1 of 2 GPUs leased
      GPU 6: free
      GPU 7: seat3 (pid 42), 12 s
    """
    now = time.time()
    lines = [f"the GPU queue: {sum(h is not None for h in held.values())} of {len(held)} GPUs leased"]
    for device, holder in held.items():
        if holder is None:
            lines.append(f"  GPU {device}: free")
        else:
            since = holder.get("since")
            age = f", {now - since:.0f} s" if isinstance(since, (int, float)) else ""
            lines.append(f"  GPU {device}: {holder.get('who', '?')} (pid {holder.get('pid', '?')}){age}")
    return "\n".join(lines)


def slurm_queue_text(partition: str, jobs: list[dict[str, str]]) -> str:
    """The room's checks in Slurm's queue: who runs where, who waits.

    >>> print(slurm_queue_text("gpu", [{"who": "seat3", "state": "RUNNING", "node": "dgx1", "time": "0:12",
    ...                                  "gres": "gres:gpu:2"}, {"who": "seat5", "state": "PENDING", "node": "",
    ...                                  "time": "0:00", "gres": "gres:gpu:2"}]))
    the GPU queue (Slurm's partition gpu): checks on GPUs 1, waiting 1
      seat3: RUNNING on dgx1, 0:12
      seat5: PENDING
    """
    running = [j for j in jobs if j["state"] == "RUNNING"]
    waiting = sum(j["state"] == "PENDING" for j in jobs)  # COMPLETING and the like are neither
    lines = [f"the GPU queue (Slurm's partition {partition}): checks on GPUs {len(running)}, waiting {waiting}"]
    for job in jobs:
        where = f" on {job['node']}, {job['time']}" if job["state"] == "RUNNING" else ""
        lines.append(f"  {job['who']}: {job['state']}{where}")
    return "\n".join(lines)
