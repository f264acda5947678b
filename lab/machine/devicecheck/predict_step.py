"""The device check's `predict` step: `lab predict` from 1 and 2 GPUs to every GPU of the host, its largest error
stated against the bound the published tables hold (lab.measure.prediction.validate.ERROR_BOUND)."""

from __future__ import annotations

import json
import math

from lab.machine.devicecheck.harness import Harness, Outcome, StepFailed, mark
from lab.verdict import HELD

# `lab predict` reads latency and bandwidth from an all-reduce on its largest measured job, so it measures 1 and 2
# ranks (--measure-up-to's least) and predicts from 3: the step needs 3 GPUs, or 3 CPU ranks at toy size.
PREDICT_MEASURED = 2
PREDICT_RANKS = PREDICT_MEASURED + 1


def predict(c: Harness) -> Outcome:
    """`lab predict` over every GPU of the host: 1 and 2 GPUs measured, 3..N predicted from them, then measured; the
    line states the largest error on the GPUs it predicted. Every world size must have run on the GPUs (a job that
    fell back to the CPU fails the step), and at least one must have been predicted, not measured only."""
    from lab.measure.prediction.validate import ERROR_BOUND

    largest = c.gpus if c.gpu else PREDICT_RANKS  # on a CPU (--allow-cpu): 3 gloo ranks at toy size
    out = c.out / "predict.json"
    out.unlink(missing_ok=True)  # a last check's result must not stand in for this one's
    c.lab(
        "predict",
        "predict",
        "--config",
        c.config,
        *c.fast,
        "--measure-up-to",
        str(PREDICT_MEASURED),
        "--check-up-to",
        str(largest),
        "--steps",
        "2" if c.quick else "8",
        "--warmup",
        "1" if c.quick else "2",
        *(["--batch-per-rank", "16"] if c.quick else []),
        "--json",
        str(out),
    )
    doc = json.loads(out.read_text())
    rows = doc["rows"]
    predicted = [r for r in rows if not r["input"]]
    sizes = [r["world_size"] for r in rows]
    if sizes != list(range(1, largest + 1)) or not predicted:
        raise StepFailed(f"world sizes {sizes} for 1..{largest}, {len(predicted)} of them predicted; see {out}")
    devices = sorted({m["device"] for m in doc["measured"]})
    if c.gpu and "cpu" in devices:
        raise StepFailed(f"a world size ran on the CPU, not the GPUs (devices: {', '.join(devices)}); see {out}")
    numbers = [v for r in rows for k, v in r.items() if k.endswith(("_seconds", "_per_second", "error"))]
    if not all(math.isfinite(v) and v >= 0 for v in numbers):
        raise StepFailed(f"a step time or error is not a number >= 0; see {out}")
    worst = max(predicted, key=lambda r: r["error"])
    at = rows[-1]
    where = f"{c.gpus} GPUs" if c.gpu else f"{largest} CPU ranks"
    return Outcome(
        "predict",
        HELD,
        f"{where}: measured on 1 and {PREDICT_MEASURED}, predicted then measured on {_span(PREDICT_RANKS, largest)}: "
        "largest error "
        f"{worst['error']:.1%} at {worst['world_size']} (within {ERROR_BOUND:.0%}, the published tables' bound: "
        f"{mark(worst['error'] <= ERROR_BOUND)}); at {at['world_size']} a step predicted "
        f"{at['predicted_step_seconds'] * 1e3:.1f} ms, measured {at['measured_step_seconds'] * 1e3:.1f} ms",
        figures=doc,
    )


def _span(first: int, last: int) -> str:
    return str(first) if first == last else f"{first}-{last}"
