"""What `lab choose` says of a Choice: the walk as numbered questions and answers, the Horovod line, the label of
the choice, and the JSON record (the tree itself: lab.measure.sizing.choose)."""

from __future__ import annotations

import argparse
from dataclasses import asdict
from typing import Any

from lab.measure.sizing.choose import Choice, Request, decide, request

# Horovod's memory is DDP's (a whole replica per GPU, gradients averaged): it fits exactly where step 1 does.
HOROVOD_STATUS = (
    "last release 0.28.1 (June 2023), built from source against the framework, which current torch "
    "needs patched (make horovod): for a new project no fix will come from upstream, so start with DDP"
)
LABELS = {
    "ddp": "DDP",
    "zero-1": "ZeRO-1 (DeepSpeed stage 1)",
    "zero-2": "ZeRO-2 (DeepSpeed stage 2)",
    "fsdp-full": "FSDP FULL_SHARD (ZeRO-3)",
    "fsdp-hybrid": "FSDP HYBRID_SHARD (full shard in a node, replicate across nodes)",
    "offload": "offload: ZeRO-Infinity / FSDP CPU offload",
}


def horovod_line(ddp_fits: bool) -> str:
    """The Horovod answer: when it fits (where DDP does), and what its maintenance status means.

    >>> horovod_line(False).startswith("no: it shards nothing"), horovod_line(True).startswith("fits where DDP")
    (True, True)
    """
    if not ddp_fits:
        return f"no: it shards nothing (a whole replica per GPU, as DDP, which does not fit); {HOROVOD_STATUS}"
    return (
        f"fits where DDP fits (the same replica per GPU); a fit when code already trains with "
        f"hvd.DistributedOptimizer, or one horovodrun serves TensorFlow and PyTorch jobs alike: "
        f"lab train --nproc-per-node N --set dist.strategy=horovod trains it; {HOROVOD_STATUS}"
    )


def render(choice: Choice) -> str:
    """Each decision a numbered line, Horovod's last (its answer, never the choice), the notes, the choice."""
    asked = [(d.question, d.answer) for d in choice.decisions]
    asked.append(("Horovod?", horovod_line(choice.strategy == "ddp")))
    lines = [f"{i}. {question} {answer}" for i, (question, answer) in enumerate(asked, 1)]
    lines += [f"note: {note}" for note in choice.notes]
    lines += [f"choice: {LABELS[choice.strategy]}", choice.lab_train or "(no lab train line: see the notes)"]
    return "\n".join(lines)


def record(req: Request, interconnect: str, choice: Choice) -> dict[str, Any]:
    """`lab choose --json`'s document: the request, each decision with its numbers, the Horovod line, the choice."""
    return {
        "params": req.params,
        "gpus": req.gpus,
        "gpus_per_node": req.gpus_per_node,
        "nodes": req.nodes,
        "device_memory_bytes": req.device_bytes,
        "usable_bytes": req.usable_bytes,
        "headroom": req.headroom,
        "interconnect": interconnect,
        "link_gbps": req.link_gbps,
        "optimizer": req.optimizer,
        "precision": req.precision,
        "activations_bytes": req.activations_bytes,
        "decisions": [asdict(d) for d in choice.decisions],
        "horovod": horovod_line(choice.strategy == "ddp"),
        "choice": {
            "strategy": choice.strategy,
            "label": LABELS[choice.strategy],
            "lab_train": choice.lab_train,
            "notes": choice.notes,
        },
    }


def run(args: argparse.Namespace) -> int:
    """`lab choose`: the tree walked for the request, printed (and written with --json)."""
    from lab.run.training import runs

    req, summary = request(args)
    choice = decide(req)
    if args.json:  # before printing: a closed pipe (| head) must not lose the file
        runs.write_json(args.json, record(req, args.interconnect, choice))
    print(f"{summary}\n{render(choice)}")
    return 0
