"""The room's JupyterHub configuration: lab/course/room/jupyterhub_config.py calls configure(c) with JupyterHub's
config.

- **Who gets in**: NativeAuthenticator. A learner signs up under a seat's name (no other name is accepted) with a
  password of their own; the seat stays locked until the instructor authorizes it (the hub's /hub/authorize page).
  The instructor is the hub's admin; their account is made at the hub's first start with a random password,
  written to the room's `instructor-password` (mode 0600). No password is set by default anywhere.
- **Where a seat runs**: `local`, a process as the seat's own system user (lab.course.room.seats), pinned to the seat's
  cores; `docker`, a DockerSpawner container from the lab's jupyter image with the seat's GPUs as device requests,
  its memory and CPU limits and a volume of its own; `slurm`, a batchspawner job asking for the seat's GPUs.
- **When it stops**: jupyterhub-idle-culler, as a hub service, stops a server idle for idle_timeout_seconds.
- **Where it listens**: the proxy on settings.bind (loopback unless told), the hub's API on loopback.
"""

from __future__ import annotations

import os
import secrets
import sys
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nativeauthenticator import NativeAuthenticator
from traitlets import Unicode

from lab.course.room import plan as room_plan
from lab.course.room import roster, seats
from lab.course.room.host import core_list
from lab.course.room.settings import PASSWORD_FILE, STATE_ENV, RoomSettings

if TYPE_CHECKING:
    from jupyterhub.handlers import BaseHandler
    from jupyterhub.spawner import Spawner
    from traitlets.config import Config

SEAT_HOME_IN_CONTAINER = "/lab/seat"  # docker: the seat's volume (images/Dockerfile's jupyter stage makes it)


class RoomAuthenticator(NativeAuthenticator):
    """NativeAuthenticator whose admin exists from the first start, with a random password in a 0600 file (so
    nobody can claim the instructor's name by signing up first)."""

    password_file = Unicode(help="Where the instructor's first password is written (mode 0600)").tag(config=True)
    class_folder = Unicode(help="The room's folder: its class list's accounts (roster.CLASS_FILE), if any").tag(
        config=True
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for name in sorted(self.admin_users):
            if self.get_user(name) is None:
                password = secrets.token_urlsafe(12)
                if self.create_user(name, password) is None:
                    raise RuntimeError(f"could not create the room's admin {name!r}")
                path = Path(self.password_file)
                path.touch(mode=0o600)
                path.chmod(0o600)
                path.write_text(f"{name} {password}\n")
                self.log.info("the room's admin %s: its password is in %s", name, path)
        self._make_the_class()

    def _make_the_class(self) -> None:
        """Each seat of the class list an account, authorized, with its slip's password (its hash): nobody signs
        up for those seats. A seat that has an account already keeps it (the room served again)."""
        from nativeauthenticator.orm import UserInfo

        for account in roster.accounts(Path(self.class_folder)) if self.class_folder else []:
            if self.get_user(account["seat"]) is None:
                self.db.add(UserInfo(username=account["seat"], password=account["hash"].encode(), is_authorized=True))
        self.db.commit()


def configure(c: Config, state_dir: str | os.PathLike | None = None) -> None:
    """Set JupyterHub's config `c` for the room whose folder is `state_dir` (default: $LAB_ROOM_DIR)."""
    state = Path(state_dir or os.environ[STATE_ENV]).resolve()
    settings = RoomSettings.load(state)
    plan = room_plan.load(state / "plan.json")
    _where_it_listens(c, state, settings)
    _who_gets_in(c, state, settings, plan)
    _where_a_seat_runs(c, settings, plan)
    _when_it_stops(c, settings)


def _where_it_listens(c: Config, state: Path, settings: RoomSettings) -> None:
    """The proxy's and the hub's addresses, and the hub's state in the room's folder."""
    c.JupyterHub.bind_url = settings.url
    if settings.ssl_cert:  # the proxy terminates HTTPS; the hub and the seats behind it are unchanged
        c.JupyterHub.ssl_cert, c.JupyterHub.ssl_key = settings.ssl_cert, settings.ssl_key
    c.JupyterHub.hub_bind_url = f"http://{settings.hub_bind}:{settings.hub_port}"
    if settings.hub_connect_url:
        c.JupyterHub.hub_connect_url = settings.hub_connect_url
    c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{settings.proxy_api_port}"
    c.ConfigurableHTTPProxy.command = [settings.proxy]
    c.ConfigurableHTTPProxy.pid_file = str(state / "proxy.pid")
    c.JupyterHub.db_url = f"sqlite:///{state / 'hub.sqlite'}"
    c.JupyterHub.cookie_secret_file = str(state / "cookie_secret")
    c.JupyterHub.pid_file = str(state / "hub.pid")
    c.JupyterHub.last_activity_interval = settings.activity_interval_seconds


def _who_gets_in(c: Config, state: Path, settings: RoomSettings, plan: room_plan.RoomPlan) -> None:
    """NativeAuthenticator for the seats and the instructor, and where each lands after logging in."""
    c.JupyterHub.authenticator_class = RoomAuthenticator
    c.RoomAuthenticator.password_file = str(state / PASSWORD_FILE)
    c.RoomAuthenticator.class_folder = str(state)
    c.Authenticator.admin_users = {settings.admin}
    # Names: the seats and the instructor, nothing else (a sign-up under another name is refused). Who of them
    # gets in: NativeAuthenticator's approval (open_signup stays False), so every named user is "allowed".
    c.Authenticator.username_pattern = "^(" + "|".join([settings.admin, *plan.names]) + ")$"
    c.Authenticator.allow_all = True
    c.NativeAuthenticator.open_signup = False
    c.NativeAuthenticator.minimum_password_length = 8
    c.NativeAuthenticator.check_common_password = True
    c.NativeAuthenticator.allowed_failed_logins = 5
    c.NativeAuthenticator.seconds_before_next_try = 60
    c.JupyterHub.default_url = partial(landing, admin=settings.admin)


def _where_a_seat_runs(c: Config, settings: RoomSettings, plan: room_plan.RoomPlan) -> None:
    """The spawner settings.spawner names (local, docker, slurm), each seat's server given its share of the plan."""
    c.Spawner.default_url = f"/lab/tree/{seats.FIRST_LESSON}"
    c.Spawner.environment = {"JUPYTERHUB_ACTIVITY_INTERVAL": str(settings.activity_interval_seconds)}
    c.Spawner.start_timeout = 120
    c.Spawner.http_timeout = 120
    c.Spawner.pre_spawn_hook = partial(before_spawn, plan=plan, settings=settings)
    if settings.spawner == "local":
        c.JupyterHub.spawner_class = "jupyterhub.spawner.LocalProcessSpawner"
        c.Spawner.cmd = [str(Path(sys.executable).parent / "jupyterhub-singleuser")]
        c.Spawner.notebook_dir = "~"
    elif settings.spawner == "docker":
        c.JupyterHub.spawner_class = "dockerspawner.DockerSpawner"
        c.DockerSpawner.network_name = settings.network
        c.DockerSpawner.use_internal_ip = True
        c.DockerSpawner.remove = True
        c.DockerSpawner.notebook_dir = SEAT_HOME_IN_CONTAINER
        # the seat's copy of the lessons (from the image's /opt/lab/notebooks) on its volume, then its server
        c.DockerSpawner.cmd = [
            "sh",
            "-c",
            f"lab room prepare-seat {SEAT_HOME_IN_CONTAINER} && exec jupyterhub-singleuser",
        ]
    else:
        c.JupyterHub.spawner_class = "batchspawner.SlurmSpawner"
        c.SlurmSpawner.req_partition = settings.slurm_partition
        c.SlurmSpawner.req_account = settings.slurm_account
        c.SlurmSpawner.req_qos = settings.slurm_qos
        c.SlurmSpawner.req_runtime = settings.slurm_runtime
        c.Spawner.cmd = [str(Path(sys.executable).parent / "jupyterhub-singleuser")]
        c.Spawner.notebook_dir = "~"


def _when_it_stops(c: Config, settings: RoomSettings) -> None:
    """jupyterhub-idle-culler as a hub service, with the scopes it needs to stop an idle server."""
    culler = [
        sys.executable,
        "-m",
        "jupyterhub_idle_culler",
        f"--timeout={settings.idle_timeout_seconds}",
        f"--cull-every={settings.cull_every_seconds}",
    ]
    c.JupyterHub.services = [{"name": "idle-culler", "command": culler}]
    c.JupyterHub.load_roles = [
        {
            "name": "idle-culler",
            "services": ["idle-culler"],
            "scopes": ["list:users", "read:users:activity", "read:servers", "delete:servers"],
        }
    ]


def landing(handler: BaseHandler, admin: str) -> str | None:
    """Where a user lands after logging in: the instructor on the sign-ups to authorize (its own server, where the
    room has an instructor's seat, starts from /hub/spawn), a learner on their seat's JupyterLab (None: JupyterHub's
    own default, which starts it)."""
    user = handler.current_user  # None on the login form's POST itself: the name is in the form
    name = (
        user.name if user else handler.get_body_argument("username", None) if handler.request.method == "POST" else None
    )
    return f"{handler.hub.base_url}authorize" if name == admin else None


def before_spawn(spawner: Spawner, plan: room_plan.RoomPlan, settings: RoomSettings) -> None:
    """Give a seat's server what the plan gives the seat (JupyterHub's pre_spawn_hook)."""
    from tornado import web

    name = spawner.user.name
    if name not in plan.names:
        raise web.HTTPError(
            403,
            f"{name} has no seat in this room (its seats: {', '.join(plan.names)}); the "
            f"instructor's account runs a server only in a room planned with --instructor-seat",
        )
    seat = plan.seat(name)
    if settings.spawner == "docker":
        for trait, value in docker_options(seat, settings).items():
            setattr(spawner, trait, value)
        return
    home = seats.prepare_home(name)
    spawner.environment = {
        **spawner.environment,
        **seats.host_paths(),
        **seats.environment(seat, home, settings.pushgateway, settings.prometheus_url, settings.gpu_queue),
    }
    if settings.spawner == "slurm":  # SlurmSpawner's batch script: --gres, --cpus-per-task, --mem
        spawner.req_gres = f"gpu:{len(seat.devices)}" if seat.devices else ""
        spawner.req_nprocs = str(len(seat.cpus) or max(1, int(seat.cpu_share)))
        spawner.req_memory = f"{seat.memory_bytes // 2**20}M"
        spawner.environment.pop("CUDA_VISIBLE_DEVICES", None)  # Slurm picks the job's GPUs and sets it
        return
    if seat.cpus:  # the seat's cores, and only those, for its server and everything it starts
        spawner.cmd = ["taskset", "--cpu-list", core_list(seat.cpus), *spawner.cmd]


def docker_options(seat: room_plan.Seat, settings: RoomSettings) -> dict:
    """DockerSpawner's traits for `seat`: its GPUs as a device request by id, its cores, memory and CPU limit, a
    volume of its own, NCCL's runtime settings (shared memory, memlock, stack), and its environment."""
    from docker.types import DeviceRequest, Ulimit

    host = {
        "shm_size": "8g",
        "ulimits": [
            Ulimit(name="memlock", soft=settings.memlock, hard=settings.memlock),
            Ulimit(name="stack", soft=67108864, hard=67108864),
        ],
    }
    if seat.devices:
        host["device_requests"] = [
            DeviceRequest(driver="nvidia", device_ids=list(seat.devices), capabilities=[["gpu"]])
        ]
    if seat.cpus:
        host["cpuset_cpus"] = core_list(seat.cpus)
    # not seats.host_paths(): the image's PATH and JupyterLab settings are its own (its ENV)
    env = seats.environment(seat, Path(SEAT_HOME_IN_CONTAINER), settings.pushgateway, settings.prometheus_url)
    # inside the container the GPUs it was given are its 0..N-1: the device request already narrowed them
    env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(len(seat.devices)))
    return {
        "image": settings.image,
        "mem_limit": seat.memory_bytes,
        "cpu_limit": seat.cpu_share,
        # the image's entry point with --exec (NGC's set-up, then the command): the lab and hub images' own
        # would run `lab CMD`
        "extra_create_kwargs": {"entrypoint": ["/usr/local/bin/lab-entrypoint", "--exec"]},
        "extra_host_config": host,
        "volumes": {f"lab-room-{seat.name}": SEAT_HOME_IN_CONTAINER},
        "environment": {"JUPYTERHUB_ACTIVITY_INTERVAL": str(settings.activity_interval_seconds), **env},
    }
