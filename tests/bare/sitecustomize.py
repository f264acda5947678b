"""A bare interpreter: only the standard library, `lab`, and torch, torchvision, PyYAML and numpy with what they need.

Put this folder first on PYTHONPATH (`make test-bare` does) and every later top-level import of any other package
fails with ModuleNotFoundError, as it would on a host that never installed it. The GPU machine the project borrows,
and other users' hosts, have only those four packages for sure; this lets a 2-core CI machine with everything
installed prove that training, the collectives and the device check do not reach for more. Child processes inherit
PYTHONPATH, so torchrun's workers are bare too.

What is imported before this file runs (site's .pth files, e.g. the editable install's finder) stays; so does
anything already in sys.modules, which is why this file imports nothing outside the standard library.
"""

import importlib.abc
import importlib.metadata
import os
import re
import sys

# The packages a bare host is promised (pip names). LAB_BARE_ALLOW adds more, comma-separated, for a test.
BARE_DISTRIBUTIONS = ("torch", "torchvision", "PyYAML", "numpy")
# Names that are not packages a host installs: the interpreter's own start-up hooks and this package.
ALWAYS_ALLOWED = {"lab", "__main__", "sitecustomize", "usercustomize"}
# Standard-library modules whose names sys.stdlib_module_names leaves out: sysconfig's per-platform data
# (`_sysconfigdata__linux_x86_64-linux-gnu`) and the editable install's finder, which a .pth file imports.
ALLOWED_PREFIXES = ("_sysconfigdata_", "__editable__")


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement_names(dist: importlib.metadata.Distribution) -> list[str]:
    """Its required distributions, leaving out those only an extra asks for (`; extra == "..."`).

    Other markers (platform, Python version) are kept: allowing a package the marker would skip costs nothing
    when it is not installed, and `packaging`, which could evaluate them, is not ours to import here.
    """
    names = []
    for requirement in dist.requires or []:
        name, _, marker = requirement.partition(";")
        if "extra" in marker:
            continue
        match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", name)
        if match:
            names.append(match.group(1))
    return names


def allowed_distributions(roots=BARE_DISTRIBUTIONS) -> set[str]:
    """The roots and, recursively, what they require, as normalised names (only those installed)."""
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        name = _normalise(todo.pop())
        if name in seen:
            continue
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        seen.add(name)
        todo.extend(_requirement_names(dist))
    return seen


def allowed_modules(roots=BARE_DISTRIBUTIONS) -> set[str]:
    """Top-level module names a bare interpreter may import."""
    distributions = allowed_distributions(roots)
    modules = set(sys.stdlib_module_names) | ALWAYS_ALLOWED
    for module, owners in importlib.metadata.packages_distributions().items():
        if any(_normalise(owner) in distributions for owner in owners):
            modules.add(module)
    return modules


class BareFinder(importlib.abc.MetaPathFinder):
    """One of the interpreter's finders, blind to every top-level name outside `allowed`.

    Hidden names get None, as from a finder that looked and found nothing; when every finder says so, the import
    system raises ModuleNotFoundError and importlib.util.find_spec returns None, exactly as for a package that is
    not installed (torch probes optional packages both ways).
    """

    def __init__(self, inner, allowed: set[str]) -> None:
        self.inner = inner
        self.allowed = allowed

    def hides(self, fullname: str) -> bool:
        top = fullname.partition(".")[0]
        return not (top in self.allowed or top.startswith(ALLOWED_PREFIXES))

    def find_spec(self, fullname, path=None, target=None):
        if self.hides(fullname) or not hasattr(self.inner, "find_spec"):
            return None
        return self.inner.find_spec(fullname, path, target)

    def __getattr__(self, name):  # invalidate_caches, find_distributions, ...: the wrapped finder's own
        return getattr(self.inner, name)


def install() -> list:
    """Wraps every finder on sys.meta_path (including the .pth-installed ones) in a BareFinder."""
    extra = [name for name in os.environ.get("LAB_BARE_ALLOW", "").split(",") if name]
    allowed = allowed_modules(BARE_DISTRIBUTIONS + tuple(extra))
    sys.meta_path[:] = [BareFinder(finder, allowed) for finder in sys.meta_path]
    return sys.meta_path


# Only as the interpreter's start-up hook: pytest's doctest collection imports this file as tests.bare.sitecustomize,
# and must not hide the test run's own packages.
if __name__ == "sitecustomize":
    install()
