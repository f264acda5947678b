"""lab: a reproducible lab for learning and measuring PyTorch distributed data-parallel training."""

from lab import frozen_imports

__version__ = "0.1.0"

frozen_imports.install()  # torch's import-time objects out of the garbage collector's walks (lab/frozen_imports.py)
