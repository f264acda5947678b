"""A replaced file appears whole or not at all; a failed writer leaves the old content and no temp file."""

from __future__ import annotations

import fnmatch
import os
import threading

import pytest

from lab import atomic


def test_a_reader_sees_the_old_file_or_the_new_one_never_a_part(tmp_path):
    path = tmp_path / "state.bin"
    old, new = b"a" * 4_000_000, b"b" * 4_000_000
    atomic.write_bytes(path, old)
    seen: set[bytes] = set()
    done = threading.Event()

    def read_while_writing() -> None:
        while not done.is_set():
            seen.add(path.read_bytes())

    reader = threading.Thread(target=read_while_writing)
    reader.start()
    try:
        for _ in range(10):
            atomic.write_bytes(path, new)
            atomic.write_bytes(path, old, durable=True)
    finally:
        done.set()
        reader.join()
    assert seen <= {old, new}
    assert os.listdir(tmp_path) == ["state.bin"]


def test_a_failing_writer_keeps_the_previous_content_and_leaves_no_temp_file(tmp_path):
    path = tmp_path / "summary.json"
    atomic.write_text(path, "previous\n")
    with pytest.raises(RuntimeError, match="writer broke"), atomic.replacing(path) as tmp:
        tmp.write_text("half of the new")
        raise RuntimeError("writer broke")
    assert path.read_text() == "previous\n"
    assert os.listdir(tmp_path) == ["summary.json"]


def test_a_write_error_is_the_oserror_with_its_reason_and_nothing_is_created(tmp_path):
    # A missing folder is created (a --json path may name one); a folder that cannot be is the error here.
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    with pytest.raises(OSError):
        atomic.write_bytes(blocker / "last.pt", b"x", durable=True)
    assert blocker.read_text() == "not a folder" and [p.name for p in tmp_path.iterdir()] == ["a-file"]
    atomic.write_bytes(tmp_path / "new" / "r.json", b"{}")
    assert (tmp_path / "new" / "r.json").read_bytes() == b"{}"


def test_the_temp_name_is_what_run_cleanup_removes_and_prometheus_never_reads(tmp_path):
    name = atomic.temp_path(tmp_path / "run-1.json").name
    assert fnmatch.fnmatch(name, "*.tmp-*")  # RunDir clears these after a crash
    assert not fnmatch.fnmatch(name, "*.json")  # file_sd's glob: a file half written is never a target file
