"""checkpoint-every-rank: every rank saving the same file, and a DDP state_dict loaded into a plain model.

Broken: each rank calls `torch.save(state, path)` on one shared path, ROUNDS times, while a reader thread
on the last rank loads the file over and over (as a resuming job or an evaluator would). Fixed: rank 0
alone writes a temporary file beside the target and renames it over the target (lab.atomic: os.replace is
atomic on POSIX), then every rank meets at a barrier. Measured: the bytes each rank wrote (the kernel's
count, /proc/self/io), what every load of the reader found, and whether the final file loads.

Then the `module.` prefix: DDP's state_dict() names every key `module.<name>`, so loading it into the
plain model misses every key; saving `ddp.module.state_dict()`, or stripping the prefix with
`consume_prefix_in_state_dict_if_present`, loads with none missing.

>>> bytes_ratio(written_per_rank=[8_400_000, 8_400_000], rounds=10, file_bytes=840_000)
2.0
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lab.course.pitfalls import module_name, workers
from lab.run.cluster import jobs

if TYPE_CHECKING:
    from lab.run.cluster.dist import DistContext

PITFALL = "checkpoint-every-rank"
ROUNDS = 12  # checkpoints written on each side
TRAINING_SECONDS = 0.05  # between checkpoints
READ_PAUSE_SECONDS = 0.001  # between two loads of the reader: it polls, it does not spin
STATE_FEATURES = 1024  # two 1024 x 1024 linear layers: 8 MiB of float32 per checkpoint, long enough to race

WHY = (
    "After a DDP step every rank holds the same weights, so one copy is enough: save from global rank 0 "
    "only. torch.save into the live path truncates it first, so anyone loading meanwhile reads part of a file; "
    "write a temporary file beside it and os.replace it over the old one (atomic), then barrier so no rank "
    "reads before it exists. DDP's state_dict() prefixes every key with 'module.': save ddp.module.state_dict(), "
    "or strip the prefix with consume_prefix_in_state_dict_if_present, to load into the plain model."
)


def bytes_ratio(written_per_rank: list[int], rounds: int, file_bytes: int) -> float:
    """Bytes written by all ranks per checkpoint, in checkpoint sizes: N when every rank writes, 1 when one does."""
    return sum(written_per_rank) / rounds / file_bytes


def measure(world_size: int) -> dict[str, Any]:
    device = workers.choose_device(world_size)
    rank0 = workers.run_job(module_name(PITFALL), world_size, device, reports_expected=1)[0]
    broken, fixed = rank0["broken"], rank0["fixed"]
    for side in (broken, fixed):
        side["bytes_ratio"] = bytes_ratio(side["bytes_written_per_rank"], ROUNDS, side["file_bytes"])
    prefix = rank0["module_prefix"]
    broken["module_prefix"], fixed["module_prefix"] = prefix["broken"], prefix["fixed"]
    bytes_shown = abs(broken["bytes_ratio"] - world_size) < 0.01 and abs(fixed["bytes_ratio"] - 1) < 0.01
    prefix_shown = (
        prefix["broken"]["missing_keys"] > 0
        and prefix["fixed"]["missing_keys"] == 0
        and prefix["fixed"]["unexpected_keys"] == 0
        and prefix["stripped"]["missing_keys"] == 0
    )
    clean_fix = fixed["reader"]["torn"] == 0 and fixed["reader"]["wrong_contents"] == 0 and fixed["final_file_loads"]
    demonstrated = bytes_shown and prefix_shown and clean_fix
    torn_broken = broken["reader"]["torn"] + broken["reader"]["wrong_contents"]
    notes = [
        f"torn reads: the reader found a partial or mixed file {torn_broken} times out of "
        f"{broken['reader']['loads']} loads while every rank wrote, {fixed['reader']['torn']} of "
        f"{fixed['reader']['loads']} with the atomic write"
        + ("" if torn_broken else " - none this time: the race is real but depends on timing; run it again")
    ]
    if broken["reader"]["errors"]:
        notes.append(f"what the failed loads raised: {'; '.join(broken['reader']['errors'])}")
    b = prefix["broken"]
    notes.append(
        f"load_state_dict(ddp.state_dict()) into the plain model raises RuntimeError: missing "
        f"{', '.join(b['missing_examples'])}, ... ({b['missing_keys']}); unexpected "
        f"{', '.join(b['unexpected_examples'])}, ... ({b['unexpected_keys']})"
    )
    summary = (
        f"{broken['bytes_ratio']:.2f} x the checkpoint written per save by {world_size} ranks vs "
        f"{fixed['bytes_ratio']:.2f} x by rank 0; {torn_broken} torn reads vs {fixed['reader']['torn']}; "
        f"DDP state_dict into the plain model: {prefix['broken']['missing_keys']} keys missing vs "
        f"{prefix['fixed']['missing_keys']}"
    )
    if not demonstrated:
        summary = (
            "expected N x vs 1 x the bytes, a missing-key count > 0 vs 0, and no torn read after the fix; "
            "measured " + summary
        )

    def reads(side: dict[str, Any]) -> str:
        r = side["reader"]
        return f"{r['complete']} / {r['torn']} / {r['wrong_contents']} of {r['loads']}"

    def keys(result: dict[str, Any]) -> str:
        return f"{result['missing_keys']} / {result['unexpected_keys']}"

    mib = 2**20
    table = {
        "columns": ["broken: every rank torch.save(path)", "fixed: rank 0, temp file + os.replace + barrier"],
        "rows": [
            ["writers per checkpoint", world_size, 1],
            [
                "bytes written per checkpoint, all ranks",
                *(
                    f"{sum(s['bytes_written_per_rank']) / ROUNDS / mib:.1f} MiB ({s['bytes_ratio']:.2f} x the file)"
                    for s in (broken, fixed)
                ),
            ],
            ["reader's loads: complete / error / wrong data", reads(broken), reads(fixed)],
            [
                "final file loads with the right weights",
                *("yes" if s["final_file_loads"] and s["final_file_matches"] else "no" for s in (broken, fixed)),
            ],
            [
                "DDP state_dict -> plain model: missing / unexpected keys",
                keys(prefix["broken"]),
                f"{keys(prefix['fixed'])} (ddp.module.state_dict()); {keys(prefix['stripped'])} (prefix stripped)",
            ],
        ],
    }
    return {
        "pitfall": PITFALL,
        "world_size": world_size,
        "device": rank0["device"],
        "broken": broken,
        "fixed": {**fixed, "module_prefix_stripped": prefix["stripped"]},
        "demonstrated": demonstrated,
        "summary": summary,
        "why": WHY,
        "table": table,
        "notes": notes,
    }


# ----------------------------------------------------------------------------- the torchrun worker


def worker(argv: list[str]) -> None:
    import torch

    from lab.run.cluster import dist

    job = jobs.this_job(argv)
    with workers.process_group(job.params["device"]) as ctx:
        torch.manual_seed(0)  # the same weights on every rank, as after a DDP step
        model = torch.nn.Sequential(
            torch.nn.Linear(STATE_FEATURES, STATE_FEATURES), torch.nn.Linear(STATE_FEATURES, STATE_FEATURES)
        )
        state = {"model": model.state_dict(), "step": 100}
        sides = {
            side: save_rounds(ctx, job.folder / f"{side}.pt", state, every_rank=(side == "broken"))
            for side in ("broken", "fixed")
        }
        prefix = module_prefix(ctx)
        if ctx.is_primary:
            job.report(ctx.global_rank, {"device": workers.device_name(ctx), **sides, "module_prefix": prefix})
        dist.barrier(ctx)


def save_rounds(ctx: DistContext, path: Path, state: dict[str, Any], every_rank: bool) -> dict[str, Any]:
    """ROUNDS checkpoints of `state` to `path`, by every rank in place or by rank 0 atomically; rank 0 gets
    every rank's byte count, what the reader saw, and whether the final file loads."""
    import torch

    from lab import atomic
    from lab.run.cluster import dist

    reader = Reader(path, state) if ctx.global_rank == ctx.world_size - 1 else None
    written = 0
    for round_index in range(ROUNDS):
        dist.barrier(ctx)  # the ranks reach the checkpoint step together, as they do in training
        if every_rank or ctx.is_primary:
            before = bytes_written()
            if every_rank:
                torch.save(state, path)
            else:
                with atomic.replacing(path) as tmp:
                    torch.save(state, tmp)
            written += bytes_written() - before
        time.sleep(TRAINING_SECONDS)  # the steps between two checkpoints: the file stands whole for a while
        if round_index == 0:
            dist.barrier(ctx)  # from here on the file exists: what the reader finds is a torn file or a whole one
            if reader:
                reader.start()
    dist.barrier(ctx)
    seen = reader.stop() if reader else None
    gathered = dist.all_gather_object(ctx, {"written": written, "reader": seen})
    result = {
        "bytes_written_per_rank": [g["written"] for g in gathered],
        "file_bytes": path.stat().st_size,
        "reader": next(g["reader"] for g in gathered if g["reader"] is not None),
    }
    if ctx.is_primary:
        result.update(final_file_loads=False, final_file_matches=False)
        try:
            result["final_file_matches"] = same_state(torch.load(path, weights_only=True), state)
            result["final_file_loads"] = True
        except Exception:
            pass
    return result


class Reader:
    """A thread that loads the checkpoint again and again until stopped, counting what each load found:
    complete (the right weights), torn (the load failed: a partial file), wrong_contents (it loaded, but
    other weights: bytes of two writes mixed)."""

    def __init__(self, path: Path, expected: dict[str, Any]) -> None:
        self.path, self.expected = path, expected
        self.counts = {"loads": 0, "complete": 0, "torn": 0, "wrong_contents": 0, "missing": 0}
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> dict[str, Any]:
        self._stop.set()
        self._thread.join()
        return {**self.counts, "errors": self.errors}

    def _loop(self) -> None:
        import torch

        while not self._stop.wait(READ_PAUSE_SECONDS):
            self.counts["loads"] += 1
            try:
                loaded = torch.load(self.path, weights_only=True)
            except FileNotFoundError:
                self.counts["missing"] += 1
                continue
            except Exception as exc:
                self.counts["torn"] += 1
                message = f"{type(exc).__name__}: {first_sentence(str(exc))}"
                if message not in self.errors and len(self.errors) < 3:
                    self.errors.append(message)
                continue
            self.counts["complete" if same_state(loaded, self.expected) else "wrong_contents"] += 1


def first_sentence(message: str, limit: int = 160) -> str:
    """The start of a long torch error message, enough to recognise it.

    >>> first_sentence("PytorchStreamReader failed reading file data/2: file read failed. This is an internal error.")
    'PytorchStreamReader failed reading file data/2: file read failed'
    >>> first_sentence("")     # EOFError, from a file truncated to nothing, says nothing
    '(no message)'
    """
    return (message.strip().split(". ")[0].splitlines() or ["(no message)"])[0][:limit]


def same_state(loaded: Any, expected: dict[str, Any]) -> bool:
    import torch

    return (
        isinstance(loaded, dict)
        and loaded.get("step") == expected["step"]
        and loaded.get("model", {}).keys() == expected["model"].keys()
        and all(torch.equal(loaded["model"][k], v) for k, v in expected["model"].items())
    )


def bytes_written() -> int:
    """Bytes this process has passed to write() so far (Linux: /proc/self/io's wchar), else -1."""
    try:
        with open("/proc/self/io") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("wchar:"))
    except (OSError, StopIteration):
        return -1


def module_prefix(ctx: DistContext) -> dict[str, Any] | None:
    """On rank 0: what loading a DDP model's state_dict into the plain model reports, saved three ways."""
    import io

    import torch
    from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present
    from torch.nn.parallel import DistributedDataParallel

    from lab.course.pitfalls import toy

    ddp = DistributedDataParallel(toy.mlp("batch").to(ctx.device), device_ids=ctx.device_ids)
    if not ctx.is_primary:
        return None

    def saved_and_loaded(state: dict[str, Any]) -> dict[str, Any]:
        buffer = io.BytesIO()
        torch.save(state, buffer)
        buffer.seek(0)
        return torch.load(buffer, weights_only=True)

    def into_plain_model(state: dict[str, Any]) -> dict[str, Any]:
        plain = toy.mlp("batch")
        try:
            plain.load_state_dict(state)  # strict, as a resume would load
            error = None
        except RuntimeError as exc:
            error = first_sentence(" ".join(str(exc).split()))
        keys = plain.load_state_dict(state, strict=False)
        return {
            "missing_keys": len(keys.missing_keys),
            "unexpected_keys": len(keys.unexpected_keys),
            "strict_error": error,
            "first_key": next(iter(state)),
            "missing_examples": keys.missing_keys[:2],
            "unexpected_examples": keys.unexpected_keys[:2],
        }

    stripped = saved_and_loaded(ddp.state_dict())
    consume_prefix_in_state_dict_if_present(stripped, "module.")
    return {
        "broken": into_plain_model(saved_and_loaded(ddp.state_dict())),
        "fixed": into_plain_model(saved_and_loaded(ddp.module.state_dict())),
        "stripped": into_plain_model(stripped),
    }


if __name__ == "__main__":
    worker(sys.argv[1:])
