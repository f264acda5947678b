"""A real Slurm cluster on this one host, for the Slurm tests: munge, slurmctld and four slurmd.

Debian's Slurm (22.05) is built with multiple slurmd per host, so nodes n1 (127.0.0.1) and n2 (127.0.0.2) of the
default partition `lab` run side by side, and g1 (127.0.0.3) and g2 (127.0.0.4) of partition `gpu` declare two
GPUs each as a production GPU cluster does (GresTypes=gpu, Gres=gpu:2, a gres.conf naming character devices that
stand in for /dev/nvidia0-1: made with mknod, major 195 as the driver's, opened by nothing). Slurm then hands them
out as it would real ones: a job that asks (--gpus-per-node) gets SLURM_GPUS_ON_NODE, SLURM_JOB_GPUS/STEP_GPUS
and CUDA_VISIBLE_DEVICES; one that does not gives its steps none (--exclusive or not). No GPU is behind them, so
torch sees none: the tests show that a job which expected GPUs fails rather than train on the CPU. (Hiding
devices from a step, ConstrainDevices, needs task/cgroup, which this host's cgroups do not allow: not emulated.)

Everything lives in one fresh temporary folder (a restart on an old state folder brings finished jobs
back); the daemons listen on free ports; nothing in /etc is touched (SLURM_CONF points at the folder's slurm.conf).

No daemon outlives the test session: each gets PR_SET_PDEATHSIG (SIGKILL when the test process dies), and each
slurmd runs as PID 1 of its own PID namespace (`unshare --pid --kill-child`), because slurmstepd and the job's
processes outlive slurmd by design; when slurmd's namespace ends, the kernel kills everything in it.

Installs nothing: `make test` installs the packages (scripts/install-test-tools.sh), as it installs Prometheus.
"""

from __future__ import annotations

import ctypes
import os
import re
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

PR_SET_PDEATHSIG = 1
NODES = {"n1": "127.0.0.1", "n2": "127.0.0.2"}
GPU_NODES = {"g1": "127.0.0.3", "g2": "127.0.0.4"}  # partition gpu
GPUS_PER_NODE = 2
CPUS_PER_NODE = 2
DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "scontrol", "unshare")


def missing_tools() -> list[str]:
    return [name for name in DAEMONS if shutil.which(name) is None and not Path("/usr/sbin", name).exists()]


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when the test process that started it dies (a killed session too)."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    os.setsid()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _binary(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


@dataclass
class Job:
    job_id: str
    state: str
    exit_code: str  # "rc:signal", as scontrol shows it
    fields: dict[str, str] = field(repr=False)

    @property
    def rc(self) -> int:
        return int(self.exit_code.split(":")[0])


@dataclass
class SlurmCluster:
    root: Path
    processes: list[subprocess.Popen] = field(default_factory=list)

    @property
    def env(self) -> dict[str, str]:
        """What a client (sbatch, srun, scontrol) needs to reach this cluster, added to the test's environment."""
        return {**os.environ, "SLURM_CONF": str(self.root / "slurm.conf")}

    # ------------------------------------------------------------------ start and stop

    def start(self, deadline_s: float = 30.0) -> SlurmCluster:
        self.root.mkdir(parents=True, exist_ok=True)
        self.root.chmod(0o755)  # munge's socket folder and every folder above it must be world-executable
        for parent in self.root.parents:
            if parent != Path("/") and not os.stat(parent).st_mode & 0o001:
                raise RuntimeError(f"{parent} is not world-executable; munge's socket cannot live under it")
        for folder in ("state", "spool", "log", "munge", "dev"):
            (self.root / folder).mkdir()
        for index in range(GPUS_PER_NODE):  # stand-ins for /dev/nvidiaN: character devices, as Slurm needs them
            os.mknod(self.root / "dev" / f"nvidia{index}", 0o600 | stat.S_IFCHR, os.makedev(195, index))
        (self.root / "gres.conf").write_text(
            f"NodeName={','.join(GPU_NODES)} Name=gpu File={self.root / 'dev'}/nvidia[0-{GPUS_PER_NODE - 1}]\n"
        )
        key = self.root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        socket_path = self.root / "munge" / "munge.socket"
        self._spawn(
            [
                _binary("munged"),
                "--foreground",
                "--force",
                f"--socket={socket_path}",
                f"--key-file={key}",
                f"--pid-file={self.root / 'munge' / 'munged.pid'}",
                f"--log-file={self.root / 'log' / 'munged.log'}",
                f"--seed-file={self.root / 'munge' / 'munged.seed'}",
            ],
            "munged",
        )
        self._wait(lambda: socket_path.exists(), "munged's socket", deadline_s)
        ports = {"ctld": _free_port(), **{name: _free_port() for name in {**NODES, **GPU_NODES}}}
        (self.root / "slurm.conf").write_text(self._config(socket_path, ports))
        self._spawn([_binary("slurmctld"), "-D", "-i"], "slurmctld")
        for name in {**NODES, **GPU_NODES}:
            self._spawn(
                ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", _binary("slurmd"), "-D", "-N", name],
                f"slurmd-{name}",
            )
        self._wait(self._nodes_idle, "both nodes idle", deadline_s)
        return self

    def stop(self) -> None:
        for proc in reversed(self.processes):  # slurmd first, then slurmctld, then munged
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in reversed(self.processes):
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

    def _config(self, socket_path: Path, ports: dict[str, int]) -> str:
        r = self.root
        nodes = "\n".join(
            f"NodeName={name} NodeAddr={addr} Port={ports[name]} CPUs={CPUS_PER_NODE} RealMemory=2000"
            + (f" Gres=gpu:{GPUS_PER_NODE}" if name in GPU_NODES else "")
            for name, addr in {**NODES, **GPU_NODES}.items()
        )
        return f"""\
ClusterName=labtest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={ports["ctld"]}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={socket_path}
SlurmUser=root
SlurmdUser=root
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool/%n
SlurmctldPidFile={r}/slurmctld.pid
SlurmdPidFile={r}/slurmd-%n.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd-%n.log
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
KillWait=10
MessageTimeout=20
JobRequeue=1
GresTypes=gpu
{nodes}
PartitionName=lab Nodes={",".join(NODES)} Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
PartitionName=gpu Nodes={",".join(GPU_NODES)} Default=NO MaxTime=INFINITE State=UP OverSubscribe=NO
"""

    def _spawn(self, argv: list[str], name: str) -> None:
        log = open(self.root / "log" / f"{name}.out", "wb")
        env = {**self.env, "PATH": os.environ.get("PATH", "") + ":/usr/sbin"}
        self.processes.append(
            subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, env=env, preexec_fn=_die_with_parent, cwd=self.root
            )
        )

    def _wait(self, ready, what: str, deadline_s: float) -> None:
        deadline = time.monotonic() + deadline_s
        while time.monotonic() < deadline:
            dead = [p for p in self.processes if p.poll() is not None]
            if dead:
                raise RuntimeError(
                    f"a Slurm daemon exited ({dead[0].args!r} rc {dead[0].returncode}) while waiting "
                    f"for {what}; logs in {self.root / 'log'}"
                )
            if ready():
                return
            time.sleep(0.2)
        raise RuntimeError(f"no {what} within {deadline_s:g} s; logs in {self.root / 'log'}")

    def _nodes_idle(self) -> bool:
        out = self.scontrol("show", "node", "-o", check=False).stdout
        states = re.findall(r"State=(\S+)", out)
        return len(states) == len(NODES) + len(GPU_NODES) and all(s.split("+")[0] == "IDLE" for s in states)

    # ------------------------------------------------------------------ jobs

    def scontrol(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["scontrol", *args], env=self.env, capture_output=True, text=True, check=check, timeout=60
        )

    def sbatch(self, command: str, cwd: Path, workdir: Path, env: dict[str, str] | None = None) -> str:
        """Submit `command` ("sbatch -N 2 slurm/lab.sbatch", as the docs type it) from `cwd`, the job running in
        `workdir` (its output file lands there); the job id. `env` is added to the environment sbatch exports."""
        argv = shlex.split(command)
        assert argv[0] == "sbatch", command
        proc = subprocess.run(
            ["sbatch", "--parsable", f"--chdir={workdir}", *argv[1:]],
            env={**self.env, **(env or {})},
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=60,
        )
        if proc.returncode != 0:
            raise AssertionError(f"{command} exited {proc.returncode}: {proc.stderr.strip()}")
        return proc.stdout.strip().split(";")[0]

    def job(self, job_id: str) -> Job:
        out = self.scontrol("show", "job", "-o", job_id).stdout
        fields = dict(re.findall(r"(\w+)=(\S*)", out))
        return Job(job_id, fields.get("JobState", "?"), fields.get("ExitCode", "?"), fields)

    def wait(
        self,
        job_id: str,
        timeout_s: float = 180.0,
        until: tuple[str, ...] = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"),
    ) -> Job:
        """Poll `scontrol show job` (sbatch --wait backs off: a 13 s job returned after 42 s)."""
        deadline = time.monotonic() + timeout_s
        while True:
            job = self.job(job_id)
            if job.state in until:
                return job
            if time.monotonic() > deadline:
                subprocess.run(["scancel", job_id], env=self.env, check=False, timeout=30)
                raise AssertionError(f"job {job_id} still {job.state} after {timeout_s:g} s (cancelled)")
            time.sleep(0.5)
