"""`lab launch`: two local "nodes" meet in a real c10d rendezvous; a node that never joins fails in time."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.conftest import TINY, lab, run

LAB = [sys.executable, "-m", "lab"]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_nodes_meet_and_train_as_one_world(tmp_path):
    endpoint = f"127.0.0.1:{_free_port()}"
    nodes = []
    for name, addr in (("a", "127.0.0.1"), ("b", "127.0.0.2")):
        cmd = [
            *LAB,
            "launch",
            "--nnodes",
            "2",
            "--rdzv-endpoint",
            endpoint,
            "--rdzv-id",
            "meet",
            "--local-addr",
            addr,
            "--join-timeout",
            "60",
            "--",
            "-m",
            "lab",
            "train",
            *TINY,
            "--set",
            "train.max_steps=4",
            "--set",
            f"run.output_dir={tmp_path / name}",
        ]
        nodes.append(
            subprocess.Popen(
                cmd,
                cwd=tmp_path,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                env={**os.environ, "OMP_NUM_THREADS": "1"},
            )
        )
    outputs = [p.communicate(timeout=300)[0] for p in nodes]
    assert [p.returncode for p in nodes] == [0, 0], outputs
    manifests = list(tmp_path.glob("*/smoke-meet/manifest.json"))
    assert len(manifests) == 1  # global rank 0 alone keeps the records, on whichever node it landed
    manifest = json.loads(manifests[0].read_text())
    assert manifest["world_size"] == 2
    assert sorted(r["node_rank"] for r in manifest["ranks"]) == [0, 1]


def test_a_node_that_never_joins_fails_within_the_join_timeout(tmp_path):
    endpoint = f"127.0.0.1:{_free_port()}"
    # The bound below is a hang guard, not a speed check: torchrun's default join timeout is 600 s.
    proc = lab(
        "launch",
        "--nnodes",
        "2",
        "--rdzv-endpoint",
        endpoint,
        "--rdzv-id",
        "alone",
        "--join-timeout",
        "5",
        "--",
        "-m",
        "lab",
        "train",
        *TINY,
        cwd=tmp_path,
        check=False,
        timeout=120,
    )
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == (
        f"lab launch: rendezvous 'alone' at {endpoint} did not complete within 5 s: expected 2 nodes, 1 arrived"
    )
    assert not (tmp_path / "runs").exists()  # no worker ever started


def test_dry_run_prints_the_command_the_lab_builds():
    proc = run(
        [
            *LAB,
            "launch",
            "--dry-run",
            "--nproc-per-node",
            "8",
            "--nnodes",
            "2",
            "--rdzv-endpoint",
            "head:29400",
            "--rdzv-id",
            "r1",
            "--max-restarts",
            "1",
            "--",
            "-m",
            "lab",
            "bench",
            "allreduce",
        ]
    )
    # this Python's torch, not a torchrun script that a system Python may lack or take from another install
    assert proc.stdout.split()[:3] == [sys.executable, "-m", "lab.run.cluster.torchrun"]
    assert proc.stdout.split()[3:] == [
        "--nnodes",
        "2",
        "--nproc-per-node",
        "8",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        "head:29400",
        "--rdzv-id",
        "r1",
        "--max-restarts",
        "1",
        "-m",
        "lab",
        "bench",
        "allreduce",
    ]
