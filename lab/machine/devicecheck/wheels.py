"""Which wheels in a folder this interpreter lacks: how `scripts/gpu-check.sh` brings DeepSpeed (and what else a
step needs) to an offline GPU host.

    python -m lab.machine.devicecheck.wheels wheels/      # prints the wheels to install, one a line; warnings on stderr

A wheel is chosen when no distribution of its name is installed (installed ones are never shadowed: the host's
torch, numpy... stay). The script installs the chosen ones with `pip install --no-index --no-deps --target
OUT/site-packages` and puts that folder on PYTHONPATH. --no-deps because pip's --target ignores what is
installed, so DeepSpeed's `torch` requirement would send it looking for a torch wheel; instead, requirements
that neither the interpreter nor the folder satisfies are named here, one line, before anything runs.

Only the standard library: this runs before the check, on whatever Python the host has.

>>> parse_wheel_name("deepspeed-0.19.8-py3-none-any.whl")
('deepspeed', '0.19.8')
>>> normalize("Py_CPUInfo")
'py-cpuinfo'
"""

from __future__ import annotations

import importlib.metadata
import re
import sys
import zipfile
from pathlib import Path


def normalize(name: str) -> str:
    """PEP 503's normal form: how pip compares distribution names."""
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_wheel_name(filename: str) -> tuple[str, str]:
    """(distribution, version) from a wheel's file name (PEP 427: name-version[-build]-python-abi-platform.whl)."""
    parts = filename[: -len(".whl")].split("-")
    if len(parts) < 5:
        raise ValueError(f"{filename}: not a wheel file name (name-version-python-abi-platform.whl)")
    return parts[0], parts[1]


def installed(name: str) -> bool:
    try:
        importlib.metadata.distribution(name)
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


def requirements(wheel: Path) -> list[str]:
    """The distribution names a wheel requires outside its extras (markers other than `extra` are kept: the
    host's pip would apply them; a false alarm costs a line, a missed requirement a failed step)."""
    with zipfile.ZipFile(wheel) as archive:
        metadata = next((n for n in archive.namelist() if n.endswith(".dist-info/METADATA")), None)
        text = archive.read(metadata).decode() if metadata else ""
    names = []
    for line in text.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        spec = line.partition(":")[2].strip()
        if "extra ==" in spec.partition(";")[2]:
            continue
        name = re.match(r"[A-Za-z0-9._-]+", spec)  # the core metadata spec starts every Requires-Dist with one
        assert name is not None, f"{wheel.name}: a Requires-Dist line without a name: {line!r}"
        names.append(normalize(name.group(0)))
    return names


def choose(folder: Path) -> tuple[list[Path], dict[str, list[str]]]:
    """(the wheels to install, {chosen distribution: its requirements neither installed nor in the folder})."""
    newest: dict[str, Path] = {}
    for wheel in sorted(folder.glob("*.whl")):  # sorted: of two versions of one name, the later file name wins
        newest[normalize(parse_wheel_name(wheel.name)[0])] = wheel
    chosen = {name: wheel for name, wheel in newest.items() if not installed(name)}
    unmet = {}
    for name, wheel in chosen.items():
        missing = [r for r in requirements(wheel) if r not in newest and not installed(r)]
        if missing:
            unmet[name] = missing
    return list(chosen.values()), unmet


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m lab.machine.devicecheck.wheels FOLDER", file=sys.stderr)
        return 2
    folder = Path(argv[0])
    try:
        wheels, unmet = choose(folder)
    except (ValueError, zipfile.BadZipFile, OSError) as exc:
        print(f"gpu-check: {folder}: {exc}", file=sys.stderr)
        return 2
    for name, missing in unmet.items():
        print(
            f"gpu-check: {name} from {folder} needs {', '.join(missing)}, which this Python lacks and {folder} "
            f"does not hold (pip download them into {folder}); steps that import {name} may fail",
            file=sys.stderr,
        )
    for wheel in wheels:
        print(wheel)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
