"""The command-line arguments of `lab room`'s actions (their rows are lab.course.commands'): what each takes, with
the argparse types of lab.run.config.arguments, so a parsed request is already a valid one. Nothing here imports torch.
"""

from __future__ import annotations

import argparse
import os

from lab.run.config.arguments import address, at_least, executable, host_port, output_dir, output_file, plain_name, url


def plan_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--gpus",
        type=at_least(0, "{} GPUs"),
        metavar="N",
        help="GPUs to hand out, 0..N-1 (default: the host's, as NVML counts them)",
    )
    p.add_argument(
        "--devices",
        metavar="ID[,ID]",
        help="the GPUs or MIG instances to hand out, as CUDA_VISIBLE_DEVICES "
        "names them (e.g. MIG-<uuid>,...; instead of --gpus)",
    )
    seats = os.environ.get("LAB_ROOM_SEATS") or None  # compose's hub service passes it this way
    p.add_argument(
        "--seats",
        type=at_least(1, "{} seats"),
        metavar="N",
        default=seats,
        help="seats (default: $LAB_ROOM_SEATS, else one per 2 GPUs; on a CPU host one per 2 cores)",
    )
    p.add_argument(
        "--gpus-per-seat",
        type=at_least(1, "{} GPUs a seat"),
        metavar="G",
        help="GPUs each seat gets (default: the GPUs split evenly over the seats, else 2)",
    )
    p.add_argument(
        "--cores",
        type=at_least(1, "{} cores"),
        metavar="N",
        help="CPU cores to hand out (default: this host's); --cores and --memory plan another host",
    )
    p.add_argument("--memory", type=float, metavar="GIB", help="the host's memory in GiB (default: this host's)")
    p.add_argument(
        "--mig-per-gpu",
        type=int,
        choices=(2, 3, 4, 7),
        metavar="K",
        help="plan each GPU as K MIG slices, a seat each (2, 3, 4 or 7: H100 profiles 3g.40gb, 2g.20gb, 1g.20gb, "
        "1g.10gb), before the slices exist; on a host whose GPUs have MIG slices, plan without it",
    )
    p.add_argument(
        "--queue-gpus",
        type=at_least(0, "{} GPUs in the queue"),
        default=0,
        metavar="Q",
        help="keep the host's last Q whole GPUs out of the seats: every seat's multi-rank exercise checks lease 2 of "
        "them in turn (with --mig-per-gpu, the other GPUs are split); default 0, no queue",
    )
    p.add_argument(
        "--check-seconds",
        type=float,
        metavar="S",
        help="seconds of GPUs one check holds, for the queue's expected wait (default 25, assumed; the checks "
        "print theirs; through Slurm, add its turnaround, about 2 s a check)",
    )
    p.add_argument("--prefix", default="seat", help="seat names: PREFIX1, PREFIX2, ... (default seat)")
    p.add_argument(
        "--instructor-seat",
        action="store_true",
        help="one more seat, the instructor's (no GPU of its own): a JupyterLab to project the lessons from",
    )


def room_dir(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--room-dir",
        default="runs/room",
        type=output_dir,
        metavar="DIR",
        help="the room's folder: its plan, settings and the hub's state (default runs/room)",
    )


def plan_args(p: argparse.ArgumentParser) -> None:
    plan_options(p)
    p.add_argument(
        "--json",
        default="runs/room/plan.json",
        type=output_file,
        metavar="PATH",
        help="where the plan goes, for lab room serve --plan (default runs/room/plan.json)",
    )


def serve_args(p: argparse.ArgumentParser) -> None:
    plan_options(p)
    room_dir(p)
    p.add_argument("--plan", metavar="PATH", help="a plan from lab room plan (instead of planning this host now)")
    p.add_argument(
        "--spawner",
        choices=("local", "docker", "slurm"),
        default="local",
        help="local: a process per seat's system user (root); docker: a container per seat "
        "(DockerSpawner); slurm: a Slurm job per seat (batchspawner) (default local)",
    )
    p.add_argument(
        "--bind",
        default="127.0.0.1",
        type=address,
        metavar="ADDR",
        help="where learners' browsers reach the hub (default 127.0.0.1; with another, serve it over HTTPS)",
    )
    tls = p.add_mutually_exclusive_group()
    tls.add_argument("--tls-cert", metavar="PEM", help="serve HTTPS with this certificate (and --tls-key)")
    tls.add_argument(
        "--tls-self-signed",
        action="store_true",
        help="serve HTTPS with a certificate made for the day (its fingerprint printed for the learners to compare)",
    )
    p.add_argument("--tls-key", metavar="PEM", help="the certificate's private key, unencrypted (with --tls-cert)")
    p.add_argument(
        "--class",
        dest="class_list",
        metavar="FILE",
        help="the learners, one a line: each gets a seat and a password, printed on slips (slips.html in the room's "
        "folder); nobody signs up",
    )
    p.add_argument("--port", type=at_least(1), default=8000, help="the hub's port for browsers (default 8000)")
    p.add_argument("--hub-port", type=at_least(1), default=8081, help="the hub's API port, loopback (default 8081)")
    p.add_argument(
        "--proxy-api-port", type=at_least(1), default=8001, help="the proxy's API port, loopback (default 8001)"
    )
    p.add_argument(
        "--proxy",
        type=executable,
        metavar="PATH",
        help="configurable-http-proxy (default: make room-proxy's, or PATH's)",
    )
    p.add_argument(
        "--idle-timeout",
        type=at_least(10, "{} s"),
        default=3600,
        metavar="SECONDS",
        help="stop a seat's server idle this long (default 3600)",
    )
    p.add_argument(
        "--home-root",
        default="/home",
        type=output_dir,
        metavar="DIR",
        help="where new seat users' homes go (default /home)",
    )
    p.add_argument(
        "--pushgateway",
        type=host_port,
        metavar="HOST:PORT",
        help="a Pushgateway for the lessons' checks and seats' GPUs",
    )
    p.add_argument(
        "--prometheus-url", type=url, metavar="URL", help="a Prometheus for the seats' lesson 6 (default: its own)"
    )
    p.add_argument(
        "--image",
        default="lab-jupyter:0.1.0",
        type=plain_name,
        help="docker: the seats' image (default lab-jupyter:0.1.0)",
    )
    p.add_argument(
        "--network",
        default="lab-room",
        type=plain_name,
        help="docker: the network of the hub and the seats (default lab-room)",
    )
    p.add_argument(
        "--hub-bind",
        default="127.0.0.1",
        type=address,
        metavar="ADDR",
        help="the hub's API address (default 127.0.0.1; 0.0.0.0 where seats are containers)",
    )
    p.add_argument(
        "--hub-connect-url",
        default="",
        type=url,
        metavar="URL",
        help="how seats reach the hub's API when not at --hub-bind (compose: http://hub:8081)",
    )
    for option, what in (
        ("partition", "the partition seats' jobs go to (sbatch -p)"),
        ("account", "the account they are charged to (sbatch -A; a production cluster often requires one)"),
        ("qos", "their quality of service (sbatch --qos)"),
    ):
        p.add_argument(f"--slurm-{option}", type=plain_name, metavar=option.upper(), help=f"slurm: {what}")
    p.add_argument(
        "--queue-partition",
        type=plain_name,
        metavar="PARTITION",
        help="the GPU queue through Slurm: every seat's multi-rank checks get their GPUs as short jobs of this "
        "partition (salloc --gpus, its GRES), instead of the plan's local queue (a DGX that runs Slurm)",
    )
    p.add_argument(
        "--memlock",
        type=at_least(-1),
        default=-1,
        metavar="BYTES",
        help="docker: the seats' locked-memory limit (default -1, unlimited, as NCCL wants; an engine "
        "that may not raise it refuses to start a seat: give the host's hard limit, ulimit -Hl x 1024)",
    )


def status_args(p: argparse.ArgumentParser) -> None:
    room_dir(p)
    p.add_argument(
        "--json", type=output_file, metavar="PATH", help="write every seat's lessons, checks, run and memory as JSON"
    )
    p.add_argument(
        "--watch",
        type=at_least(1, "{} seconds between redraws"),
        metavar="S",
        help="redraw every S seconds until Ctrl-C (for a screen beside the room)",
    )


def seat_args(p: argparse.ArgumentParser) -> None:
    room_dir(p)
    p.add_argument("seat", metavar="SEAT", help="a seat of the room's plan, e.g. seat1")


def prepare_seat_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("home", type=output_dir, metavar="DIR")
