"""`lab room serve` (what `make room` runs): the plan, the seats' system users and homes, then JupyterHub with its
proxy, in the foreground until Ctrl-C. Everything it started stops with it: the hub stops the seats' servers
and its proxy as it exits, and whatever a seat left running (a kernel's torchrun, a lesson's Prometheus) is
stopped after it, by the seat's user id.

    lab room serve --seats 3                                   # this host, three seats; the hub at 127.0.0.1:8000
    lab room serve --plan runs/room/plan.json --bind 0.0.0.0   # a checked plan, reachable from the room's network
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import signal
import stat
import sys
import time
from dataclasses import replace
from pathlib import Path

from lab import optional
from lab.course.room import answers, plan_table, roster, seats, tls
from lab.course.room import plan as room_plan
from lab.course.room.settings import PASSWORD_FILE, STATE_ENV, RoomSettings
from lab.course.room.status import lessons
from lab.errors import LabError
from lab.run.cluster import gpu_queue, runner, slurm_gpus
from lab.run.observability import room_metrics

CONFIG_FILE = Path(__file__).with_name("jupyterhub_config.py")
# `make room-proxy` installs configurable-http-proxy (npm, pinned by jupyter/proxy/package-lock.json) here
PROXY_IN_VENV = Path(sys.prefix) / "room-proxy" / "node_modules" / ".bin" / "configurable-http-proxy"
STOP_GRACE_SECONDS = 30  # the hub stops every seat's server before it exits: give it the time


def find_proxy(given: str | None) -> str:
    for candidate in (
        given,
        str(PROXY_IN_VENV) if PROXY_IN_VENV.exists() else None,
        shutil.which("configurable-http-proxy"),
    ):
        if candidate and (Path(candidate).exists() or shutil.which(candidate)):
            return candidate
    raise LabError(
        f"configurable-http-proxy (JupyterHub's proxy, from npm) is not installed: `make room-proxy` "
        f"installs it into {PROXY_IN_VENV.parent.parent.parent}, or give its path with --proxy"
    )


# What the hub needs, by spawner (the [room] extra has them all): refused in one line before anything starts
NEEDS = {
    "local": ("jupyterhub", "nativeauthenticator", "jupyterhub_idle_culler"),
    "docker": ("jupyterhub", "nativeauthenticator", "jupyterhub_idle_culler", "dockerspawner"),
    "slurm": ("jupyterhub", "nativeauthenticator", "jupyterhub_idle_culler", "batchspawner"),
}


def run(args: argparse.Namespace) -> int:
    for module in NEEDS[args.spawner]:
        optional.require(module, "lab room serve (pip install -e '.[room]', as make room does)")
    if args.queue_partition and args.spawner == "docker":
        raise LabError("--queue-partition: a docker seat has no Slurm client to ask with; use --spawner local or slurm")
    if args.spawner == "slurm" and not args.plan and args.gpus is None and not args.devices:
        # the seats run on the cluster's nodes, and the hub on a login node that seldom has a GPU: a plan of this
        # host would ask Slurm for no GPU at all
        raise LabError(
            "lab room serve --spawner slurm: the seats run on the cluster's nodes, not on this host: describe one "
            "node with --gpus N --cores N --memory GIB (scontrol show node NAME), or give --plan FILE"
        )
    plan = room_plan.require_devices(room_plan.from_args(args), args.plan or "the plan")
    state = Path(args.room_dir).resolve()
    settings = RoomSettings(
        spawner=args.spawner,
        bind=args.bind,
        port=args.port,
        hub_port=args.hub_port,
        proxy_api_port=args.proxy_api_port,
        proxy=find_proxy(args.proxy),
        idle_timeout_seconds=args.idle_timeout,
        cull_every_seconds=min(300, max(5, args.idle_timeout // 2)),
        home_root=args.home_root,
        pushgateway=args.pushgateway or "",
        prometheus_url=args.prometheus_url or "",
        image=args.image,
        network=args.network,
        hub_bind=args.hub_bind,
        hub_connect_url=args.hub_connect_url,
        memlock=args.memlock,
        slurm_partition=args.slurm_partition or "",
        slurm_account=args.slurm_account or "",
        slurm_qos=args.slurm_qos or "",
    )
    # Every check before anything is made: a certificate given, Slurm's partition, the class list, the queue's folder.
    given = _given_tls(args)
    if args.queue_partition:
        settings = replace(settings, gpu_queue=_slurm_queue(args.queue_partition))
    places = roster.read(args.class_list, plan.names) if args.class_list else []
    queue_folder = _queue_folder(plan, settings, state) if plan.queue and not settings.gpu_queue else None
    settings = _with_tls(args, settings, state, given)
    if settings.spawner in ("local", "slurm"):  # seats as system users (of the cluster's nodes too, under Slurm)
        _make_seats(plan, Path(settings.home_root))
        print(answers.said(answers.close()), flush=True)  # before any seat's server starts
    if queue_folder is not None:
        settings = replace(settings, gpu_queue=str(gpu_queue.prepare(queue_folder, plan.queue)))
        print(f"the GPU queue: {queue_folder} (GPUs {','.join(plan.queue)}, leased by the seats' multi-rank checks)")
    state.mkdir(parents=True, exist_ok=True)
    state.chmod(0o700)  # the hub's database, cookie secret and the instructor's password
    room_plan.save(plan, state / "plan.json")
    settings.save(state)
    if places:
        fingerprint = tls.fingerprint(Path(settings.ssl_cert)) if settings.ssl_cert else ""
        _, slips = roster.save(places, state, settings.url, fingerprint)
        print(f"the class: {len(places)} learners seated; print their slips: {slips} (root's alone)", flush=True)
    if settings.pushgateway:
        room_metrics.push_room_seats(settings.pushgateway, [(s.name, list(s.devices)) for s in plan.seats])
        room_metrics.push_room_lessons(settings.pushgateway, lessons())
    print(plan_table.table(plan), flush=True)
    print(
        f"\nthe room: {settings.url}/hub/ ("
        + ("the class logs in with their slips; " if places else f"learners sign up as {', '.join(plan.names)}; ")
        + f"authorize others at /hub/authorize as {settings.admin}, whose password is in {state / PASSWORD_FILE}); "
        f"Ctrl-C stops the room",
        flush=True,
    )
    env = {**os.environ, STATE_ENV: str(state), "CONFIGPROXY_AUTH_TOKEN": secrets.token_hex(32)}
    try:
        done = runner.run(
            [sys.executable, "-m", "jupyterhub", "-f", str(CONFIG_FILE)],
            env=env,
            echo=False,
            stop_grace_seconds=STOP_GRACE_SECONDS,
        )
    finally:
        if settings.spawner in ("local", "slurm"):
            for name in plan.names:
                if seats.made_by_a_room(name):  # never someone's own account's processes
                    stop_user_processes(name)
    return 0 if done.returncode == 0 else 1


def _given_tls(args: argparse.Namespace) -> tuple[Path, Path] | None:
    """The instructor's certificate and key, checked (None where none is given). LabError in one line."""
    if bool(args.tls_cert) != bool(args.tls_key) and not args.tls_self_signed:
        raise LabError("--tls-cert and --tls-key go together: the certificate and its private key (PEM files)")
    if args.tls_self_signed and args.tls_key:
        raise LabError("--tls-key goes with --tls-cert; --tls-self-signed makes its own key")
    return tls.checked(args.tls_cert, args.tls_key) if args.tls_cert else None


def _with_tls(
    args: argparse.Namespace, settings: RoomSettings, state: Path, given: tuple[Path, Path] | None
) -> RoomSettings:
    """The certificate the proxy serves: the instructor's (`given`), or one made for the day; none without either."""
    if given is not None:
        cert, key = given
    elif args.tls_self_signed:
        cert, key = tls.day_certificate(state, settings.bind)
        print(
            f"HTTPS with a certificate made for the day ({cert}): browsers warn; learners compare its SHA-256 "
            f"fingerprint {tls.fingerprint(cert)}",
            flush=True,
        )
    else:
        return settings
    return replace(settings, ssl_cert=str(cert), ssl_key=str(key))


def _queue_folder(plan: room_plan.RoomPlan, settings: RoomSettings, state: Path) -> Path | None:
    """Where the plan's GPU queue goes (beside the room's folder, which is the owner's alone), checked before it is
    made: the local seats must reach it. None where the seats cannot use it (said)."""
    if settings.spawner != "local":
        print(
            f"note: the plan's queue (GPUs {','.join(plan.queue)}) serves local seats only: a {settings.spawner} "
            f"seat's checks run on its own devices or the CPU (or give --queue-partition: the queue through Slurm)",
            flush=True,
        )
        return None
    folder = state.parent / f"{state.name}-gpu-queue"
    for parent in reversed(folder.parents):
        if parent.exists() and not parent.stat().st_mode & stat.S_IXOTH:
            raise LabError(
                f"{folder}: the seats cannot reach the room's GPU queue: {parent} lets others no search (x); "
                f"chmod o+x {parent}, or give --room-dir a folder the seats can reach"
            )
    return folder


def _slurm_queue(partition: str) -> str:
    """The queue as Slurm's partition, checked now (a room whose every check would fail to get GPUs stops here)."""
    per_node = slurm_gpus.partition(partition, f"--queue-partition {partition}").gpus_per_node
    if per_node < room_plan.QUEUE_RANKS:
        raise LabError(
            f"--queue-partition {partition}: its nodes have {per_node} GPU(s) in Slurm's Gres; a multi-rank check "
            f"asks for {room_plan.QUEUE_RANKS} on one node: give a partition of GPU nodes (sinfo -o '%P %G')"
        )
    print(f"the GPU queue: Slurm's partition {partition} ({per_node} GPUs a node, leased by the seats' checks)")
    return f"{slurm_gpus.PREFIX}{partition}"


def _make_seats(plan: room_plan.RoomPlan, home_root: Path) -> None:
    if os.geteuid() != 0:
        raise LabError(
            "lab room serve: each seat runs as a system user of its own, which only root can start "
            "(sudo make room), or use Docker (docker compose --profile room up hub)"
        )
    for seat in plan.seats:
        seats.ensure_user(seat.name, home_root)
    why = seats.unreachable(plan.seats[0].name, [Path(sys.executable), seats.CHECKOUT])
    if why:
        raise LabError(why)


def stop_user_processes(name: str, grace_seconds: float = 5.0) -> int:
    """SIGTERM, then SIGKILL after `grace_seconds`, to every process of system user `name`; how many there were."""
    import pwd

    try:
        uid = pwd.getpwnam(name).pw_uid
    except KeyError:
        return 0

    def theirs() -> list[int]:
        found = []
        for status in Path("/proc").glob("[0-9]*/status"):
            try:
                line = next(x for x in status.read_text().splitlines() if x.startswith("Uid:"))
            except (OSError, StopIteration):
                continue
            if int(line.split()[1]) == uid:
                found.append(int(status.parent.name))
        return found

    first = theirs()
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in theirs():
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_seconds
        while theirs() and time.monotonic() < deadline:
            time.sleep(0.1)
    return len(first)
