"""`lab validate DIR`: the fabric check's verdict from a Slurm validation job's all-reduce results, written as the
same validate.json the Ansible validate role writes (playbooks/roles/validate/tasks/verdict.yml), so `lab report`
reads either.

    lab validate runs/v1/validate --nodes dgx01,dgx02 --run-id v1 --out runs/v1/validate.json
    lab validate DIR --nodes a,b --run-id v1 --out v.json --floor gpu_pair=300 --floor nodes=150

What DIR holds (the job writes it; each file may be missing, and its absence is a problem, not bad input):
    node-NAME.json    `lab bench allreduce --json` over all of node NAME's GPUs (two CPU processes without GPUs)
    node-NAME.log     that run's output: its last line names why, when the JSON is missing
    nodes.json        one all-reduce over every node together (rank 0's); nodes.log the head's output
    health-NAME.json  optional: {"dcgm_diag", "xid_events", "ecc_uncorrected"} as the role's health.yml reads them

The role checks every pair of GPUs on a node and, when all nodes are slow, a ring of node pairs; the Slurm job
runs one all-reduce per node and one over all of them, so pairs holds one entry per node and ring is empty.

>>> describe_pair("cpu"), describe_pair("0,1"), describe_pair("0,1,2,3")
('two CPU processes', 'GPU pair 0,1', 'GPUs 0,1,2,3')
>>> parse_floors(["nodes=150", "cpu_pair=1e-3"])["nodes"], parse_floors([])["gpu_pair"]
(150.0, 200.0)
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from lab import atomic
from lab.errors import EXIT_FAILED, EXIT_OK, LabError

# The validate role's defaults (playbooks/roles/validate/defaults/main.yml, validate_default_floors; its comment
# says where the numbers come from). lab/ does not read playbooks/: tests/unit/test_fabric.py holds them equal.
DEFAULT_FLOORS: dict[str, float] = {"gpu_pair": 200.0, "nodes": 100.0, "cpu_pair": 0.01}

# What the role's health.yml reads with DCGM, the kernel log and nvidia-smi; a Slurm job reads none of it itself.
NOT_READ_HEALTH = {"dcgm_diag": "not run (Slurm validation job)", "xid_events": "not read",
                   "ecc_uncorrected": "not read"}

DEFINITIONS = {
    "busbw": "nccl-tests' bus bandwidth of all_reduce, algbw * 2 (n-1) / n, GB/s (1e9), averaged over the sizes",
    "floor": "lab validate's --floor KEY=GBPS (gpu_pair, cpu_pair or nodes; unset keys: the validate role's "
             "defaults), the same on every node",
}

LOG_TAIL_BYTES = 65536  # enough for a last line; a long job's log is not read whole


# ----------------------------------------------------------------------------- input


def parse_floors(items: list[str]) -> dict[str, float]:
    """--floor KEY=GBPS (repeatable) over DEFAULT_FLOORS; a bad key or value is one line naming it."""
    floors = dict(DEFAULT_FLOORS)
    for item in items:
        key, _, value = item.partition("=")
        floors[key.strip()] = _gbps(item, key.strip(), value.strip())
    return floors


def _gbps(item: str, key: str, value: str) -> float:
    wanted = f"expected KEY=GBPS with KEY one of {', '.join(DEFAULT_FLOORS)} and GBPS a number >= 0, " \
             f"e.g. --floor gpu_pair=200"
    if key not in DEFAULT_FLOORS:
        raise LabError(f"--floor {item!r}: unknown key {key!r}; {wanted}")
    try:
        gbps = float(value)
    except ValueError:
        raise LabError(f"--floor {item!r}: {value!r} is not a number; {wanted}") from None
    if not math.isfinite(gbps) or gbps < 0:
        raise LabError(f"--floor {item!r}: {value!r} is not a finite number >= 0; {wanted}")
    return gbps


def parse_nodes(text: str) -> list[str]:
    """--nodes n1,n2: the job's nodes in order (the first is the head); each names its files in DIR."""
    nodes = [name.strip() for name in text.split(",")]
    if not all(nodes) or any("/" in name for name in nodes):
        raise LabError(f"--nodes {text!r}: expected node names separated by commas, e.g. --nodes dgx01,dgx02")
    if len(set(nodes)) != len(nodes):
        raise LabError(f"--nodes {text!r}: a node is named twice; name each of the job's nodes once")
    return nodes


def _folder(path: str | Path) -> Path:
    folder = Path(path)
    if not folder.is_dir():
        raise LabError(f"DIR {str(path)!r}: no such folder; expected the Slurm validation job's folder of "
                       f"node-NAME.json and nodes.json results")
    return folder


def _result(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    """(the allreduce JSON, None), or (None, why there is none) when it is missing or not such a result."""
    if not path.exists():
        return None, None
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        return None, f"{path.name}: not readable JSON ({exc})"
    missing = [key for key in ("rows", "avg_busbw", "world_size") if not isinstance(doc, dict) or key not in doc]
    if missing:
        return None, f"{path.name}: not a `lab bench allreduce --json` result (no {', '.join(missing)})"
    return doc, None


def last_line(path: Path) -> str | None:
    """The last non-empty line of a log (read from its tail), None when there is no such file."""
    if not path.exists():
        return None
    with open(path, "rb") as f:
        f.seek(max(0, path.stat().st_size - LOG_TAIL_BYTES))
        lines = [line.strip() for line in f.read().decode(errors="replace").splitlines()]
    return next((line for line in reversed(lines) if line), f"{path.name} is empty")


def _why_missing(folder: Path, stem: str, unreadable: str | None) -> str:
    """Why `stem`.json gave no figure: its own fault, else its log's last line, else that nothing is there."""
    line = last_line(folder / f"{stem}.log")
    if unreadable:
        return unreadable + (f"; {stem}.log: {line}" if line else "")
    return line if line is not None else f"no {stem}.json and no {stem}.log"


# ----------------------------------------------------------------------------- figures


def wrong_elements(doc: dict[str, Any]) -> int:
    """#wrong over every size, out-of-place and in-place (in-place is null where it is not checked)."""
    return sum(row["oop_wrong"] + (row["ip_wrong"] or 0) for row in doc["rows"])


def on_gpus(doc: dict[str, Any]) -> bool:
    """Whether the run was on GPUs: collective_perf records each rank's device name ("cpu" on a CPU)."""
    devices = doc.get("devices") or []
    return any(name != "cpu" for name in devices) if devices else doc.get("backend") == "nccl"


def describe_pair(pair: str) -> str:
    """What a pairs entry measured, as the role's problems say it ("GPU pair 0,1"), "GPUs ..." over more than two."""
    if pair == "cpu":
        return "two CPU processes"
    return f"GPUs {pair}" if pair.count(",") > 1 else f"GPU pair {pair}"


def _shortfall(avg_busbw: float, floor: float, wrong: int) -> str:
    """The role's wording of a missed check: the busbw below its floor, or the wrong results it found."""
    if avg_busbw < floor:
        return f"busbw {avg_busbw:.3g} GB/s, below its floor {floor:g} GB/s" + \
            (f" (and {wrong} wrong elements)" if wrong else "")
    return f"{wrong} wrong elements (busbw {avg_busbw:.3g} GB/s, floor {floor:g} GB/s)"


# ----------------------------------------------------------------------------- one node


def node_record(folder: Path, name: str, floors: dict[str, float], like: dict[str, Any] | None
                ) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """(nodes[name], runs[name]["node"], its problems). `like`: another node's result, for what a node that wrote
    none was asked to run (one job asks every node for the same)."""
    doc, unreadable = _result(folder / f"node-{name}.json")
    shape = doc or like
    gpus = (shape["world_size"] if on_gpus(shape) else 0) if shape else None
    pair = ("cpu" if gpus == 0 else ",".join(map(str, range(gpus)))) if gpus is not None else "all"
    floor = floors["cpu_pair" if pair == "cpu" else "gpu_pair"]
    entry: dict[str, Any] = {"pair": pair, "rc": None, "avg_busbw": None, "floor": floor, "ok": False,
                             "error": None}
    # rc stays None: the Slurm step's exit code is not in DIR (the role's is the command's); the log says why
    problems, what = [], f"{name}: all-reduce of {describe_pair(pair)}"
    if doc is None:
        entry["error"] = _why_missing(folder, f"node-{name}", unreadable)
        problems.append(f"{what}: no result: {entry['error']}")
    else:
        wrong = wrong_elements(doc)
        entry.update(avg_busbw=doc["avg_busbw"], wrong=wrong, ok=wrong == 0 and doc["avg_busbw"] >= floor)
        if not entry["ok"]:
            problems.append(f"{what}: {_shortfall(doc['avg_busbw'], floor, wrong)}")
    health, health_problems = _health(folder, name)
    record = {"gpus": gpus, "floors": floors, "pairs": [entry], "health": health}
    run = {"result": f"node-{name}.json" if doc else None, "log": f"node-{name}.log",
           "last_line": last_line(folder / f"node-{name}.log")}
    return record, run, problems + health_problems


def _health(folder: Path, name: str) -> tuple[dict[str, Any], list[str]]:
    """health-NAME.json where the job read the node's tools, else NOT_READ_HEALTH; a failed DCGM diagnostic is a
    problem, as in the role."""
    path = folder / f"health-{name}.json"
    if not path.exists():
        return dict(NOT_READ_HEALTH), []
    try:
        health = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        return dict(NOT_READ_HEALTH), [f"{name}: {path.name}: not readable JSON ({exc})"]
    missing = [key for key in NOT_READ_HEALTH if not isinstance(health, dict) or key not in health]
    if missing:
        return dict(NOT_READ_HEALTH), [f"{name}: {path.name}: no {', '.join(missing)}"]
    diag = str(health["dcgm_diag"])
    level = f" -r {health['dcgm_level']}" if "dcgm_level" in health else ""
    return health, [f"{name}: dcgmi diag{level}: {diag}"] if diag.startswith("fail") else []


# ----------------------------------------------------------------------------- all nodes


def all_nodes_check(folder: Path, nodes: list[str], floors: dict[str, float]
                    ) -> tuple[dict[str, Any] | None, dict[str, Any], list[str]]:
    """(all_nodes, runs[head]["nodes"], its problems). One node alone has no all-nodes check to miss."""
    doc, unreadable = _result(folder / "nodes.json")
    run = {"result": "nodes.json" if doc else None, "log": "nodes.log", "last_line": last_line(folder / "nodes.log")}
    if doc is None:
        if len(nodes) == 1 and unreadable is None:
            return None, run, []
        why = _why_missing(folder, "nodes", unreadable)
        return None, run, [f"all nodes: the all-reduce did not complete: {nodes[0]}: {why}"]
    wrong, floor = wrong_elements(doc), floors["nodes"]
    check = {"hosts": nodes, "world_size": doc["world_size"], "avg_busbw": doc["avg_busbw"], "floor": floor,
             "wrong": wrong, "ok": wrong == 0 and doc["avg_busbw"] >= floor}
    if check["ok"]:
        return check, run, []
    if doc["avg_busbw"] < floor:
        return check, run, [f"all nodes: {doc['world_size']} ranks: busbw {doc['avg_busbw']:.3g} GB/s, below "
                            f"{floor:g} GB/s, the highest floor among them"
                            + (f" (and {wrong} wrong elements)" if wrong else "")]
    return check, run, [f"all nodes: {doc['world_size']} ranks: {_shortfall(doc['avg_busbw'], floor, wrong)}"]


# ----------------------------------------------------------------------------- the verdict


def verdict(folder: str | Path, nodes: list[str], run_id: str,
            floors: dict[str, float] | None = None) -> dict[str, Any]:
    """validate.json's document for the results in `folder`: every node of `nodes` (a node that wrote nothing is
    reported too), all nodes together, the problems in the role's words. Reads files, writes none."""
    folder = _folder(folder)
    floors = {**DEFAULT_FLOORS, **{key: _gbps(f"{key}={gbps}", key, str(gbps)) for key, gbps in (floors or {}).items()}}
    if not nodes:
        raise LabError("--nodes: no nodes; name the job's nodes in order, e.g. --nodes dgx01,dgx02")
    results = [doc for name in nodes if (doc := _result(folder / f"node-{name}.json")[0])]
    like = results[0] if results else None
    records, runs, problems = {}, {}, []
    for name in nodes:
        records[name], node_run, node_problems = node_record(folder, name, floors, like)
        runs[name] = {"node": node_run}
        problems += node_problems
    check, head_run, across_problems = all_nodes_check(folder, nodes, floors)
    runs[nodes[0]]["nodes"] = head_run
    problems += across_problems
    return {"check": "validate", "platform": "slurm", "run_id": run_id, "ok": not problems, "problems": problems,
            "definitions": DEFINITIONS, "nodes": records, "all_nodes": check, "ring": {}, "suspects": [],
            "runs": runs}


def run(args) -> int:
    """`lab validate`: write validate.json, print each problem and the verdict; exit 0 passed, 1 failed."""
    doc = verdict(args.folder, parse_nodes(args.nodes), args.run_id, parse_floors(args.floor))
    atomic.write_text(args.out, json.dumps(doc, indent=2) + "\n")
    for problem in doc["problems"]:
        print(problem)
    count = len(doc["problems"])
    outcome = "passed" if doc["ok"] else f"FAILED ({count} problem{'s' if count > 1 else ''})"
    print(f"validate: {outcome}; every figure: {args.out}")
    return EXIT_OK if doc["ok"] else EXIT_FAILED
