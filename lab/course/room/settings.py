"""What `lab room serve` decided for the hub (addresses, spawner, idle timeout, proxy, image), written beside the
plan in the room's folder so that the hub's configuration (lab/course/room/hub.py, run by JupyterHub) reads the same.

    runs/room/plan.json       the seats (lab room plan)
    runs/room/settings.json   this
    runs/room/hub.sqlite, cookie_secret, instructor-password (mode 0600)   the hub's own state
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from lab import atomic
from lab.errors import LabError

FILE = "settings.json"
PASSWORD_FILE = "instructor-password"  # the instructor's first password, beside the hub's state (mode 0600)
STATE_ENV = "LAB_ROOM_DIR"  # the room's folder, for the hub's configuration
SPAWNERS = ("local", "docker", "slurm")


@dataclass(frozen=True)
class RoomSettings:
    spawner: str = "local"  # local: a process per seat's system user; docker: DockerSpawner; slurm
    bind: str = "127.0.0.1"  # where the hub's proxy listens for browsers (loopback unless told)
    port: int = 8000
    hub_bind: str = "127.0.0.1"  # the hub's own API, for the proxy and the seats' servers
    hub_port: int = 8081
    hub_connect_url: str = ""  # how a seat reaches the hub when it is not the hub's bind address
    proxy_api_port: int = 8001
    proxy: str = "configurable-http-proxy"
    admin: str = "instructor"
    idle_timeout_seconds: int = 3600  # a seat's server idle this long is stopped (jupyterhub-idle-culler)
    cull_every_seconds: int = 300
    home_root: str = "/home"  # where seats' system users get their homes (local)
    pushgateway: str = ""  # host:port: lessons push their checks, the room each seat's GPUs
    prometheus_url: str = ""  # a Prometheus the seats' lesson 6 uses instead of starting one
    image: str = "lab-jupyter:0.1.0"  # docker: the seats' image (images/Dockerfile, target jupyter)
    network: str = "lab-room"  # docker: the network the hub and the seats share
    memlock: int = -1  # docker: the seats' memlock limit in bytes (-1: unlimited, for NCCL)
    slurm_partition: str = ""  # slurm: the partition seats' jobs go to
    slurm_account: str = ""  # slurm: the account they are charged to (sbatch -A)
    slurm_qos: str = ""  # slurm: their quality of service (sbatch --qos)
    slurm_runtime: str = "8:00:00"  # slurm: a seat's job's time limit
    ssl_cert: str = ""  # the proxy's certificate and key: the room over HTTPS ("" for HTTP)
    ssl_key: str = ""
    gpu_queue: str = ""  # the folder of the plan's GPU queue, or slurm:PARTITION (lab.run.cluster.gpu_queue); "" none

    @property
    def url(self) -> str:
        """Where learners' browsers reach the room."""
        return f"{'https' if self.ssl_cert else 'http'}://{self.bind}:{self.port}"

    @property
    def activity_interval_seconds(self) -> int:
        """How often a seat's server reports activity and the hub reads the proxy's: often enough that the
        culler sees a busy seat as busy (JupyterHub's default, 300 s, would let a short timeout cull it)."""
        return max(1, min(300, self.idle_timeout_seconds // 4))

    def save(self, folder: Path) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        atomic.write_text(folder / FILE, json.dumps(asdict(self), indent=2) + "\n")
        return folder / FILE

    @classmethod
    def load(cls, folder: Path) -> RoomSettings:
        path = Path(folder) / FILE
        try:
            raw = json.loads(path.read_text())
            known = {f.name for f in fields(cls)}
            return cls(**{k: v for k, v in raw.items() if k in known})
        except (OSError, ValueError, TypeError) as exc:
            raise LabError(
                f"{path}: the room's settings cannot be read ({exc}); start the room with lab room serve"
            ) from None
