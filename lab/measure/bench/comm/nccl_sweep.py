"""The NCCL settings of `lab bench levers`: one `lab bench allreduce` job per environment variable.

NCCL picks its all-reduce algorithm (Ring, Tree) and protocol (Simple, LL, LL128) by itself, and uses
peer-to-peer links (NVLink, PCIe P2P) where it finds them. Stas Bekman's ml-engineering book shows what
each choice is worth by forcing it with an environment variable and comparing bus bandwidth, most
tellingly NCCL_P2P_DISABLE=1, which sends every byte through host memory. This sweep does the same on the
machine at hand: on GPUs with 2+ ranks, one child job as NCCL chooses and one under each setting in
NCCL_SETTINGS, each row's average busbw a ratio to NCCL's own choice. A child that fails (a protocol the
hardware refuses) is a row with its error, not a failed benchmark. gloo, on a CPU, reads no NCCL_*
variable, so there the sweep reports why it does not apply.

>>> [f"{s[0]}={s[1]}" for s in NCCL_SETTINGS if s]
['NCCL_ALGO=Ring', 'NCCL_ALGO=Tree', 'NCCL_PROTO=Simple', 'NCCL_PROTO=LL128', 'NCCL_P2P_DISABLE=1']
"""

from __future__ import annotations

import json
import shlex
import subprocess
import tempfile
from pathlib import Path
from typing import Any

# One all-reduce sweep per setting, as Stas Bekman's ml-engineering book compares them: the algorithm
# (Ring, Tree), the protocol (Simple, LL128), and what peer-to-peer (NVLink, PCIe P2P) is worth.
NCCL_SETTINGS: list[tuple[str, str] | None] = [
    None,
    ("NCCL_ALGO", "Ring"),
    ("NCCL_ALGO", "Tree"),
    ("NCCL_PROTO", "Simple"),
    ("NCCL_PROTO", "LL128"),
    ("NCCL_P2P_DISABLE", "1"),
]
NCCL_VARIABLES = sorted({setting[0] for setting in NCCL_SETTINGS if setting})
# 1 MiB (latency-bound) to 256 MiB (bandwidth-bound) in three sizes, a few iterations each: a comparison,
# not a full nccl-tests sweep.
ALLREDUCE_ARGS = ["-b", "1M", "-e", "256M", "-f", "16", "-n", "10", "-w", "3"]


def nccl_child(
    world_size: int,
    setting: tuple[str, str] | None,
    json_path: str | Path,
    base_env: dict[str, str],
    torchrun: str | None = None,
) -> tuple[list[str], dict[str, str]]:
    """argv and environment of one `lab bench allreduce` job under `setting` (None: NCCL's own choice).
    The other settings' variables are removed, so a value the user exported does not leak into a row.

    >>> argv, env = nccl_child(8, ("NCCL_ALGO", "Tree"), "/tmp/t.json", {"NCCL_PROTO": "LL", "PATH": "/bin"},
    ...                        torchrun="torchrun")
    >>> " ".join(argv)
    'torchrun --standalone --nproc-per-node 8 -m lab bench allreduce -b 1M -e 256M -f 16 -n 10 -w 3 --json /tmp/t.json'
    >>> sorted(env.items())
    [('NCCL_ALGO', 'Tree'), ('PATH', '/bin')]
    """
    from lab.run.cluster import launch

    argv = launch.torchrun_command(
        world_size, ["-m", "lab", "bench", "allreduce", *ALLREDUCE_ARGS, "--json", str(json_path)], torchrun=torchrun
    )
    env = {k: v for k, v in base_env.items() if k not in NCCL_VARIABLES}
    if setting is not None:
        env[setting[0]] = setting[1]
    return argv, env


def nccl_row(label: str, argv: list[str], env: dict[str, str], json_path: Path, processes: int = 1) -> dict[str, Any]:
    """Run one all-reduce job of `processes` ranks; its busbw per size, or an `error` with the workers' line that
    says what went wrong (not torchrun's banner after it) when it failed."""
    from lab.run.cluster import runner

    print(f"$ {label} {shlex.join(argv)}", flush=True)
    done = runner.run(argv, env=env, processes=processes, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, echo=False)
    if done.returncode != 0 or not json_path.exists():
        return {"label": label, "error": f"exit {done.returncode}: {done.last_error[:200]}"}
    result = json.loads(json_path.read_text())
    return {
        "label": label,
        "avg_busbw": result["avg_busbw"],
        "busbw_by_size": [
            {"size": r["size"], "oop_busbw": r["oop_busbw"], "ip_busbw": r["ip_busbw"]} for r in result["rows"]
        ],
    }


def nccl_group(world_size: int, device_type: str) -> dict[str, Any]:
    """The NCCL settings' all-reduce rows with their ratio to NCCL's own choice, or why they do not apply."""
    if device_type != "cuda":
        return {"applicable": False, "reason": "the CPU runs gloo, which reads no NCCL_* variable"}
    if world_size < 2:
        return {"applicable": False, "reason": "one GPU: there is no all-reduce to tune"}
    from lab.run.cluster import launch

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, setting in enumerate(NCCL_SETTINGS):
            label = "default" if setting is None else f"{setting[0]}={setting[1]}"
            json_path = Path(tmp) / f"nccl{i}.json"
            argv, env = nccl_child(world_size, setting, json_path, launch.worker_env(world_size))
            rows.append(nccl_row(label, argv, env, json_path, world_size))
    default = rows[0].get("avg_busbw")
    for r in rows:
        if "avg_busbw" in r:
            r["ratio_to_default"] = r["avg_busbw"] / default if default else None
    return {"applicable": True, "rows": rows}
