"""The lint gate catches what it is for: `make lint`, in a copy of this checkout with one planted module, fails on an
unused import (ruff), a type error and a function without annotations (mypy, which refuses untyped definitions in
lab/), and a 200-line function (ruff's statement and complexity rules), and names each; the checkout as committed
passes it (make test runs `make lint` before any test, so a clean tree is proven there)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import PYTHON, ROOT

PLANTED = (
    '''"""A module planted by tests/unit/test_lint.py."""

import json


def half(count: int) -> int:
    return count / 2


def untyped(count):
    return count


def long(count: int) -> int:
'''
    + "".join(f"    count += {i}\n" for i in range(198))
    + """    return count
"""
)


@pytest.mark.slow
def test_make_lint_fails_on_a_planted_unused_import_and_a_planted_type_error(tmp_path):
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    copy = tmp_path / "checkout"
    for name in filter(None, tracked.decode().split("\0")):
        if (ROOT / name).is_file():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, copy / name)
    (copy / ".venv").symlink_to(Path(PYTHON).parent.parent)
    if (ROOT / ".mypy_cache").is_dir():  # mypy's own cache: only the planted module is checked anew
        shutil.copytree(ROOT / ".mypy_cache", copy / ".mypy_cache")
    (copy / "lab" / "planted.py").write_text(PLANTED)
    # -k: both halves of the gate run even when the first fails; -o: .venv is this one, installed already
    proc = subprocess.run(
        ["make", "-k", "-o", ".venv/.installed-stamp", "lint"], cwd=copy, capture_output=True, text=True, timeout=600
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "lab/planted.py:3:8: F401 [*] `json` imported but unused" in out, out
    assert 'lab/planted.py:7: error: Incompatible return value type (got "float", expected "int")' in out, out
    assert "lab/planted.py:10: error: Function is missing a type annotation  [no-untyped-def]" in out, out
    assert "lab/planted.py:14:5: PLR0915 Too many statements (198 > 50)" in out, out
    findings = re.findall(r"^(\S+\.py):\d+:(?:\d+: [A-Z]+\d+|\s*error:)", out, re.M)
    assert set(findings) == {"lab/planted.py"}, out  # nothing else in the tree is wrong
