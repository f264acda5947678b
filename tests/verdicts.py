"""One vocabulary in every record the lab writes (lab.verdict): walk a JSON record and name each verdict outside it.

A verdict lives in a field named `verdict` (and accept's per-node `device_check`), and is one of held, failed, not
run, not applicable. The words of the vocabularies it replaced (ok, warn, note, fail, pass, passed, skipped, not
tried, PASS, FAIL) may appear in no verdict-bearing field, nor as the value of a `status` field (a run's status is
its state: completed, stopped, failed, running); the old flags (`passed`, `held`, `failed_checks`) are gone.
"""

from __future__ import annotations

from typing import Any

from lab.verdict import VERDICTS

VERDICT_FIELDS = {"verdict", "device_check", "left_out"}  # left_out: a planned step's verdict without running
RUN_STATES = {"completed", "stopped", "failed", "running"}  # summary.json's and a room's newest run's `status`
OLD_FLAGS = {"passed", "held", "failed_checks"}
MEASURED = {"facts", "figures"}  # what a tool printed or a benchmark measured (a GPU's fabric "status": "Success")


def outside(record: Any, where: str = "") -> list[str]:
    """Each place in `record` where a verdict is not one of lab.verdict's words, as `path: what`."""
    found: list[str] = []
    if isinstance(record, dict):
        for key, value in record.items():
            here = f"{where}.{key}" if where else str(key)
            if key in VERDICT_FIELDS and value not in VERDICTS and not (key == "left_out" and value is None):
                found.append(f"{here}: {value!r} is not one of {', '.join(VERDICTS)}")
            elif key == "status" and isinstance(value, str) and value not in RUN_STATES:
                found.append(f"{here}: {value!r}: a verdict goes in a `verdict` field, in lab.verdict's words")
            elif key in OLD_FLAGS and isinstance(value, (bool, list)):  # `counts` keeps a number per verdict
                found.append(f"{here}: the old flag {key!r}; a record says its `verdict`")
            if key not in MEASURED:
                found += outside(value, here)
    elif isinstance(record, list):
        for index, value in enumerate(record):
            found += outside(value, f"{where}[{index}]")
    return found
