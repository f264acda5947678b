"""torch's and torchvision's import-time objects frozen out of Python's cyclic garbage collector (`gc.freeze`) as
soon as each import is done, in the processes whose program is the lab's own: `lab ...`, `python -m lab ...` and
every `python -m lab.<module>` rank, job or torchrun agent (lab.run.cluster.torchrun) it starts; not in a kernel
or pytest, and no longer once a lab module that runs someone else's script says so (`leave_alone`: `lab launch --
SCRIPT.py`'s lab.run.cluster.watched, the grader's lab.course.exercises.observe).

Why: a collection of the oldest generation walks every object alive, and the interpreter's last one, at exit,
walks them all. torch's import leaves about 300,000 of them (its operators' wrappers, decompositions,
registrations), so that walk costs each process about a CPU-second at exit. Frozen objects are never walked again
(CPython's documentation recommends it for what a process loads before its real work): an import and exit takes
0.67 of the CPU, a 2-rank `lab train` 0.81 (BENCHMARKS.md, "frozen imports").

What it costs, and why only the lab's own programs: a frozen object is never collected, so a cycle it is part of
is never finalised. That includes the module dictionaries that exist at the freeze, `__main__`'s among them: a
script's global open file would not be flushed at exit. The lab's modules hold no such thing (their files are
written and closed, or atomically replaced), and everything made after the import, a run's own objects, is
collected and finalised at exit as before. A learner's or user's script is never run under it.

>>> lab_is_main(["python3", "-u", "-m", "lab", "train"]), lab_is_main(["python3", "/venv/bin/lab", "doctor"])
(True, True)
>>> lab_is_main(["python3", "-m", "lab.course.pitfalls.set_epoch"]), lab_is_main(["python3", "-m", "labx"])
(True, False)
>>> lab_is_main(["python3", "/venv/bin/torchrun", "train.py"]), lab_is_main(["python3", "train.py"])
(False, False)
>>> lab_is_main(["python3", "-X", "dev", "-c", "import lab"]), lab_is_main(["python3", "-m", "pytest"])
(False, False)
"""

from __future__ import annotations

import gc
import importlib.abc
import importlib.machinery
import os
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

HEAVY = frozenset({"torch", "torchvision"})  # the imports whose objects are worth freezing (measured: torch's ~1 s)
OFF_ENV = "LAB_FREEZE_IMPORTS"  # =0: leave the collector as Python sets it (to compare, or to rule this out)
_TAKES_VALUE = frozenset({"-W", "-X", "-Q"})  # the interpreter's options whose value is the next argument


def lab_is_main(argv: Sequence[str]) -> bool:
    """Whether the interpreter's command line (sys.orig_argv) runs the lab's own program."""
    args = iter(argv[1:])
    for arg in args:
        if arg == "-m":
            module = next(args, "")
            return module == "lab" or module.startswith("lab.")
        if arg.startswith("-c") or arg == "-":
            return False
        if arg in _TAKES_VALUE:
            next(args, None)
        elif not arg.startswith("-"):
            return os.path.basename(arg) == "lab"  # the console script
    return False


class _ThenFreeze(importlib.abc.Loader):
    """The module's own loader, then `gc.freeze()`: the module's objects leave the collector's generations."""

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self._loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        # No collection during the import either: each one of the oldest generation would walk what the import
        # has made so far, and an import makes next to no garbage
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            self._loader.exec_module(module)
        finally:
            gc.freeze()
            if was_enabled:
                gc.enable()

    def __getattr__(self, name: str) -> Any:  # resource readers and the like: the real loader's
        return getattr(self._loader, name)


class _FreezeAfter(importlib.abc.MetaPathFinder):
    """Finds a HEAVY top-level module as the finders after it would, and wraps its loader in `_ThenFreeze`."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in HEAVY:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _ThenFreeze(spec.loader)
                return spec
        return None


def install(argv: Sequence[str] | None = None) -> bool:
    """In the lab's own program (`argv`: default sys.orig_argv), freeze after each HEAVY import from now on (one
    that already happened is frozen now). Whether it is installed."""
    argv = getattr(sys, "orig_argv", []) if argv is None else argv
    if os.environ.get(OFF_ENV) == "0" or not lab_is_main(argv):
        return False
    if not any(isinstance(f, _FreezeAfter) for f in sys.meta_path):
        if HEAVY & sys.modules.keys():
            gc.freeze()
        sys.meta_path.insert(0, _FreezeAfter())
    return True


def leave_alone() -> None:
    """No freezing in this process from now on: a lab module that runs someone else's script as `__main__` calls it
    before the script runs, so the script's globals (made after anything frozen so far) are finalised at exit as
    under plain Python, whatever it imports."""
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _FreezeAfter)]
