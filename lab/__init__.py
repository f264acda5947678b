"""lab: a reproducible lab for learning and measuring PyTorch distributed data-parallel training."""

__version__ = "0.1.0"
