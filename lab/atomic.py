"""Replace a file atomically: whoever reads it sees the old content or the new, never half of either.

Checkpoints, run records, Prometheus target files, CIFAR-10 batches and profiler traces are all
read while the lab may be writing them (by a resuming run, by Prometheus, by a person). Each is
written here: into a temporary file beside the target, then renamed over it with `os.replace`,
which POSIX makes atomic within one file system (hence beside the target, not in /tmp).

The temporary file is `<name>.tmp-<pid>`: the pid keeps two processes writing the same target
apart, `RunDir` clears `*.tmp-*` left by a killed process, and the name never ends like the
target, so a glob such as Prometheus' file_sd `*.json` cannot pick up a file half written.
On any failure the temporary file is removed and the target is untouched.

>>> import tempfile, pathlib
>>> target = pathlib.Path(tempfile.mkdtemp()) / "summary.json"
>>> write_text(target, '{"loss": 0.5}\\n')
>>> target.read_text()
'{"loss": 0.5}\\n'
>>> with replacing(target) as tmp:  # for writers that want a file name (torch.profiler's traces)
...     _ = tmp.write_text('{"loss": 0.25}\\n')
...     print(tmp.name.startswith("summary.json.tmp-"), target.read_text().strip())
True {"loss": 0.5}
>>> target.read_text().strip(), [p.name for p in target.parent.iterdir()]
('{"loss": 0.25}', ['summary.json'])
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path


def temp_path(path: str | Path) -> Path:
    """The temporary file that becomes `path`: beside it, named by this process.

    >>> temp_path("runs/r/last.pt").name == f"last.pt.tmp-{os.getpid()}"
    True
    """
    path = Path(path)
    return path.with_name(f"{path.name}.tmp-{os.getpid()}")


@contextlib.contextmanager
def replacing(path: str | Path, durable: bool = False) -> Iterator[Path]:
    """Yield a temporary path to write; when the block ends without an error, it replaces `path`.

    `durable`: fsync the file before the rename and the directory after it, so that the new
    content, not only the rename, survives a power cut (checkpoints, downloaded data). Not for
    files rewritten every few seconds: an fsync can take long on a busy disk.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)  # `--json out/r.json` names a folder that may not exist yet
    tmp = temp_path(path)
    try:
        yield tmp
        if durable:
            _fsync(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)  # a failed writer's partial file; after the rename, nothing is there
    if durable:
        _fsync(path.parent)  # the rename itself is a change of the directory


def write_bytes(
    path: str | Path, data: bytes | bytearray | memoryview, durable: bool = False, mode: int | None = None
) -> None:
    """Replace `path` with `data`. A write error (a full disk) raises the OSError with its reason. `mode`: the new
    file's permissions from its creation on (a secret, 0o600, is never readable by others, not for a moment)."""
    with replacing(path, durable) as tmp:
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666 if mode is None else mode), "wb") as f:
            f.write(data)
        if mode is not None:
            os.chmod(tmp, mode)  # exactly `mode`, whatever the umask took away


def write_text(path: str | Path, text: str, durable: bool = False, mode: int | None = None) -> None:
    """Replace `path` with `text`, encoded as UTF-8 (`mode` as write_bytes takes it)."""
    write_bytes(path, text.encode(), durable, mode)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)  # any descriptor will do: fsync flushes the file, not the descriptor
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
