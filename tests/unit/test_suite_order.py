"""The suite's own schedule (tests/conftest.py): its files run longest first, and make test keeps that order on its
xdist workers (pytest-xdist's loadfile otherwise starts the files with the most tests first)."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import FILE_SECONDS, FOLDER_ORDER, ROOT


def test_every_file_the_schedule_names_exists_in_a_folder_it_orders():
    missing = [name for name in FILE_SECONDS if not (ROOT / "tests" / name).is_file()]
    assert missing == [], f"tests/conftest.py FILE_SECONDS names files that are not there: {missing}"
    assert {name.split("/")[0] for name in FILE_SECONDS} <= set(FOLDER_ORDER)


def test_the_longest_files_are_collected_first_and_make_test_keeps_their_order():
    # given in the opposite order: an unlisted unit file, a listed unit file, the longest (the lessons)
    files = ["tests/unit/test_suite_order.py", "tests/unit/test_workshop.py", "tests/notebooks/test_notebooks.py"]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *files],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    collected = [line.split("::")[0] for line in done.stdout.splitlines() if "::" in line]
    assert list(dict.fromkeys(collected)) == files[::-1], done.stdout[-2000:]
    make = subprocess.run(["make", "-n", "--no-print-directory", "test-main"], cwd=ROOT, capture_output=True, text=True)
    assert "--dist loadfile --no-loadscope-reorder" in make.stdout, make.stdout + make.stderr
