"""The suite's own schedule (tests/conftest.py): the files it orders by their cost exist, so a renamed long file is
not silently scheduled last again."""

from __future__ import annotations

from tests.conftest import FILE_SECONDS, FOLDER_ORDER, ROOT


def test_every_file_the_schedule_names_exists_in_a_folder_it_orders():
    missing = [name for name in FILE_SECONDS if not (ROOT / "tests" / name).is_file()]
    assert missing == [], f"tests/conftest.py FILE_SECONDS names files that are not there: {missing}"
    assert {name.split("/")[0] for name in FILE_SECONDS} <= set(FOLDER_ORDER)
