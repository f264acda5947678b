"""The torchrun command line, built in one place for the CLI, the workshop, compose and Ansible.

>>> " ".join(torchrun_command(2, ["-m", "lab", "train", "--config", "ddp"], torchrun="torchrun"))
'torchrun --standalone --nproc-per-node 2 -m lab train --config ddp'
>>> rdzv = Rendezvous(endpoint="head:29400", nnodes="2", run_id="r1", max_restarts=1)
>>> " ".join(torchrun_command(8, ["-m", "lab", "train"], rdzv, torchrun="torchrun"))
'torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint head:29400 --rdzv-id r1 --max-restarts 1
-m lab train'
>>> rdzv = Rendezvous(endpoint="head:29400", nnodes="2", run_id="r1", join_timeout=60, store_host=False)
>>> " ".join(torchrun_command(1, ["train.py"], rdzv, torchrun="torchrun"))
'torchrun --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint head:29400 --rdzv-id r1 --rdzv-conf
join_timeout=60,read_timeout=60,is_host=0 train.py'
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from lab.errors import LabError
from lab.run.cluster import child_output, cores, runner, torchrun_env

NODE_ADDRESS_VARIABLE = "LAB_NODE_ADDRESS"  # this node's --local-addr, as its workers see it
# A rank whose peer on another node died fails at once under gloo, before the peer's node has said why (a rank
# killed by a signal, say), and srun --kill-on-bad-exit stops every node at the first failure it hears: a node
# whose workers only lost a peer (or the store, with the head) waits this long after its own line, so that the
# node with the cause is heard first and says it.
PEER_LOST = re.compile(r"Connection (?:reset|closed) by peer|remote process exit|RendezvousConnectionError")
PEER_LOST_GRACE_SECONDS = 10
TORCHRUN_JOIN_TIMEOUT = 600  # seconds: torchrun's own default for a rendezvous to complete


@dataclass(frozen=True)
class Rendezvous:
    """Where the nodes of one job meet. No endpoint means one node (`--standalone`, a free local port)."""

    endpoint: str | None = None  # "host:port" of the c10d rendezvous (the head node)
    nnodes: str = "1"  # "N", or "MIN:MAX" for an elastic job
    run_id: str | None = None  # one id shared by every node of the job
    max_restarts: int = 0  # times torchrun restarts the worker group after a failure
    local_addr: str | None = None  # this node's address when it has several
    join_timeout: int | None = None  # seconds for every node to arrive (torchrun's default: 600)
    # whether this node's torchrun serves the rendezvous store; None: torch guesses from the endpoint's address,
    # and any node guesses yes where the endpoint is a loopback address (several "nodes" on one host)
    store_host: bool | None = None

    @property
    def min_nodes(self) -> int:
        return int(self.nnodes.split(":")[0])

    @property
    def join_timeout_or_default(self) -> int:
        return self.join_timeout or TORCHRUN_JOIN_TIMEOUT

    @property
    def host_port(self) -> tuple[str, str]:
        """The endpoint split at its last colon (an IPv6 host keeps its own colons)."""
        host, _, port = (self.endpoint or "").rpartition(":")
        return host, port

    def check(self) -> Rendezvous:
        """Refuse what torchrun would refuse with a traceback: one line naming the option (exit 2)."""
        bounds = self.nnodes.split(":")
        if not (
            1 <= len(bounds) <= 2
            and all(b.isdigit() and int(b) >= 1 for b in bounds)
            and int(bounds[0]) <= int(bounds[-1])
        ):
            raise LabError(f"--nnodes: {self.nnodes!r} is not a node count; use N or MIN:MAX with 1 <= MIN <= MAX")
        if self.endpoint is not None:
            host, port = self.host_port
            if not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise LabError(f"--rdzv-endpoint: {self.endpoint!r} is not HOST:PORT; e.g. head-node:29400")
        elif bounds != ["1"]:
            raise LabError(f"--nnodes {self.nnodes} needs --rdzv-endpoint HOST:PORT (the head node's rendezvous)")
        elif self.run_id or self.join_timeout or self.local_addr:
            raise LabError("--rdzv-id, --join-timeout and --local-addr are for multi-node jobs; add --rdzv-endpoint")
        if self.max_restarts < 0:
            raise LabError(f"--max-restarts: {self.max_restarts}; use 0 or more")
        if self.join_timeout is not None and self.join_timeout < 1:
            raise LabError(f"--join-timeout: {self.join_timeout} s; use 1 or more")
        return self


def check_not_nested() -> None:
    """A command that starts torchrun itself (--nproc-per-node) refuses to run inside a torchrun worker."""
    if torchrun_env.launched_by_torchrun():
        raise LabError("--nproc-per-node: already running under torchrun; drop the option")


def torchrun_executable() -> list[str]:
    """torchrun as this Python's module: the torch this process imports, whatever is beside it or on PATH.

    A system or NGC Python often has no `torchrun` script beside it, and the one on PATH may belong to another
    Python (another torch, or none); `python -m torch.distributed.run` is what that script runs, and
    `lab.run.cluster.torchrun` runs the same `main` as the lab's own program (its import of torch frozen, as the
    ranks' are: lab/frozen_imports.py).
    """
    return [sys.executable, "-m", "lab.run.cluster.torchrun"]


def torchrun_command(
    nproc_per_node: int, target: list[str], rendezvous: Rendezvous | None = None, torchrun: str | None = None
) -> list[str]:
    """argv for torchrun starting `nproc_per_node` workers of `target` (e.g. ["-m", "lab", "train", ...]).

    `torchrun` names an executable to use instead of this Python's torch.distributed.run.
    """
    rdzv = rendezvous or Rendezvous()
    cmd = [torchrun] if torchrun else torchrun_executable()
    if rdzv.endpoint is None:
        cmd += ["--standalone", "--nproc-per-node", str(nproc_per_node)]
    else:
        cmd += [
            "--nnodes",
            rdzv.nnodes,
            "--nproc-per-node",
            str(nproc_per_node),
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            rdzv.endpoint,
        ]
        if rdzv.run_id:
            cmd += ["--rdzv-id", rdzv.run_id]
        conf = []
        if rdzv.join_timeout:
            # read_timeout bounds a non-head node's wait to reach the head's store at all
            conf += [f"join_timeout={rdzv.join_timeout}", f"read_timeout={rdzv.join_timeout}"]
        if rdzv.store_host is not None:
            conf.append(f"is_host={int(rdzv.store_host)}")
        if conf:
            cmd += ["--rdzv-conf", ",".join(conf)]
    if rdzv.max_restarts:
        cmd += ["--max-restarts", str(rdzv.max_restarts)]
    if rdzv.local_addr:
        cmd += ["--local-addr", rdzv.local_addr]
    return cmd + list(target)


def worker_env(nproc_per_node: int, env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for torchrun on one node: OMP_NUM_THREADS split over the workers (torchrun
    would otherwise set 1 and warn), unless the user chose a value."""
    env = dict(os.environ if env is None else env)
    env.setdefault("OMP_NUM_THREADS", str(cores.threads_per_process(nproc_per_node)))
    return env


def lab_target(command: str, config: str | None, overrides: list[str]) -> list[str]:
    """`-m lab <command> --config C --set k=v ...`: what each torchrun worker runs."""
    target = ["-m", "lab", command]
    if config:
        target += ["--config", config]
    for item in overrides:
        target += ["--set", item]
    return target


def run(
    command: list[str],
    nproc_per_node: int,
    rendezvous: Rendezvous | None = None,
    extra_env: dict[str, str] | None = None,
    hang_folder: Path | None = None,
) -> int:
    """Run torchrun through the lab's runner (SIGINT and SIGTERM passed on, its process group stopped whichever
    way it ends) and return its exit status. A multi-node run that ends in failure after its join timeout,
    with fewer nodes than expected ever seen at the rendezvous, says so: expected and arrived nodes.
    (A rendezvous cannot fail sooner than its join timeout, so a quick failure of the workers is never
    mistaken for one.)

    A run that fails in a collective (a rank that never came, another collective, a rank killed) is named after
    it from what its ranks' watchdogs left in `hang_folder` (lab.run.cluster.hang; default: a temporary folder, kept
    only when it holds a diagnosis)."""
    from lab.run.cluster import hang
    from lab.run.cluster.rollcall import RollCall

    rdzv = rendezvous or Rendezvous()
    runner.check_processes(nproc_per_node, f"--nproc-per-node {nproc_per_node}")
    started = time.monotonic()
    multi_node = rdzv.endpoint is not None
    folder = child_output.StackFolder()
    tail: list[str] = []  # the end of torchrun's stderr, for the one-line reason when this node fails

    def relay(line: str) -> None:
        folder.relay(line)
        tail.append(line)
        del tail[:-200]

    given = hang_folder or os.environ.get(hang.FOLDER_ENV)
    diagnosis_folder = Path(given) if given else Path(tempfile.mkdtemp(prefix="lab-hang-"))
    roll_call = None
    if multi_node:  # the observer's client retries until the head's store is up
        host, port = rdzv.host_port
        roll_call = RollCall(
            host, int(port), rdzv.run_id or "default", rdzv.join_timeout_or_default, expected=rdzv.min_nodes
        ).start()
    try:
        # the workers learn this node's address (--local-addr): their exporters listen there (lab.run.observability)
        address = {NODE_ADDRESS_VARIABLE: rdzv.local_addr} if rdzv.local_addr else {}
        hang_env = {hang.FOLDER_ENV: str(diagnosis_folder)}
        status = runner.run(
            command,
            env={**worker_env(nproc_per_node), **address, **hang_env, **(extra_env or {})},
            processes=nproc_per_node,
            stderr=subprocess.PIPE,  # torchrun's failure table names a rank killed by a signal
            each_line=relay,
        ).returncode  # line by line: the log keeps its order
    except KeyboardInterrupt:  # Ctrl-C, or the runner's Stopped: a stalled run's diagnosis before the exit
        folder.flush()
        said = hang.say_after_failure(diagnosis_folder, nproc_per_node, tail, "lab launch")
        if said:
            print(said, file=sys.stderr, flush=True)
        raise
    finally:
        folder.flush()
        if roll_call is not None:
            roll_call.stop()
    said = hang.say_after_failure(diagnosis_folder, nproc_per_node, tail, "lab launch") if status != 0 else None
    if said:
        print(said, file=sys.stderr, flush=True)
    elif not given:
        shutil.rmtree(diagnosis_folder, ignore_errors=True)
    if status == 0 and folder.warnings:
        print(
            f"lab launch: the run succeeded; the {folder.warnings} c10d warning(s) above ({folder.folded} lines of "
            f"C++ stack left out) are torchrun's agents closing the rendezvous after the store on the head had "
            f"gone: harmless",
            file=sys.stderr,
            flush=True,
        )
    if (
        roll_call is not None
        and status != 0
        and (roll_call.arrived or 0) < rdzv.min_nodes
        and time.monotonic() - started >= rdzv.join_timeout_or_default
    ):
        print(rendezvous_failure(rdzv, roll_call.arrived), file=sys.stderr, flush=True)
    elif multi_node and status != 0:
        _say_node_failed(rdzv, status, failure_reason(tail))
    return status


def _say_node_failed(rdzv: Rendezvous, status: int, reason: str) -> None:
    """This node's one line; where its ranks only lost a peer, a wait for the node that knows why (PEER_LOST:
    gloo's words, NCCL's ncclRemoteError, torchrun's agent losing the head's store).

    >>> [bool(PEER_LOST.search(r)) for r in (
    ...     "RuntimeError: [../pair.cc:545] Read error [10.0.0.7]:49827: Connection reset by peer. This is ...",
    ...     "RuntimeError: [../pair.cc:561] Connection closed by peer [10.0.0.7]:11399",
    ...     "DistBackendError: NCCL error in: ..., remote process exited or there was a network error",
    ...     "torch.distributed.elastic.rendezvous.api.RendezvousConnectionError: The connection to the C10d store ...",
    ...     "rank 1 (local_rank: 0): Signal 9 (SIGKILL) received by PID 42",
    ...     "ValueError: loss is nan")]
    [True, True, True, True, False, False]
    """
    node = f" ({rdzv.local_addr})" if rdzv.local_addr else ""
    said = f"lab launch: this node's workers{node} failed, torchrun exit {status}: {reason}"
    print(said, file=sys.stderr, flush=True)
    if PEER_LOST.search(reason):  # said before the wait: srun may stop this node during it
        print(
            f"lab launch: a peer on another node went first; waiting {PEER_LOST_GRACE_SECONDS} s for its node to "
            f"say why",
            file=sys.stderr,
            flush=True,
        )
        time.sleep(PEER_LOST_GRACE_SECONDS)


def failure_reason(lines: list[str]) -> str:
    """What ended a failed worker group, from torchrun's stderr: a worker's exception line, else the root cause
    torchrun's failure table names (a rank killed by a signal raises nothing).

    >>> print(failure_reason(["ChildFailedError:", "  rank      : 1 (local_rank: 0)", "  exitcode  : -9 (pid: 42)",
    ...                       "  traceback : Signal 9 (SIGKILL) received by PID 42", "====="]))
    rank 1 (local_rank: 0): Signal 9 (SIGKILL) received by PID 42
    >>> print(failure_reason(["Traceback ...", "ValueError: loss is nan", "ChildFailedError:", "  rank : 0"]))
    ValueError: loss is nan
    """
    error = child_output.last_error_line("".join(line if line.endswith("\n") else line + "\n" for line in lines))
    if re.search(r"\b\w*(Error|Exception)\b:", error):
        return error
    table = dict(re.findall(r"^\s*(rank|exitcode|traceback)\s*:\s*(.+?)\s*$", "\n".join(lines), re.MULTILINE))
    if "rank" in table:
        cause = table.get("traceback", "")
        cause = cause if cause and not cause.startswith("To enable traceback") else f"exit code {table.get('exitcode')}"
        return f"rank {table['rank']}: {cause}"
    return error


def rendezvous_failure(rdzv: Rendezvous, arrived: int | None) -> str:
    """The one line a node prints when its rendezvous did not complete.

    >>> print(rendezvous_failure(Rendezvous("10.0.0.1:29400", "2", "r7", join_timeout=30), 1))
    lab launch: rendezvous 'r7' at 10.0.0.1:29400 did not complete within 30 s: expected 2 nodes, 1 arrived
    >>> print(rendezvous_failure(Rendezvous("10.0.0.1:29400", "2:4", "r7"), None))
    lab launch: rendezvous 'r7' at 10.0.0.1:29400 was never reached from this node (join timeout 600 s): expected 2 to
    4 nodes; check the head node is started and its port is open
    """
    expected = rdzv.nnodes.replace(":", " to ")
    within = rdzv.join_timeout_or_default
    where = f"lab launch: rendezvous '{rdzv.run_id or 'default'}' at {rdzv.endpoint}"
    if arrived is None:
        # torchrun retries the connection a while past read_timeout, so no "within" is promised here
        return (
            f"{where} was never reached from this node (join timeout {within} s): expected {expected} nodes; "
            f"check the head node is started and its port is open"
        )
    return f"{where} did not complete within {within} s: expected {expected} nodes, {arrived} arrived"
