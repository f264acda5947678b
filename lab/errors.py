"""Errors a user can cause. The CLI prints their message as one line and exits 2.

Anything else that escapes is a failed run (exit 1) and keeps its traceback,
because then the traceback is what a developer needs.
"""


class LabError(Exception):
    """Bad input: a config, an argument, a data file, a checkpoint, an inventory."""

    exit_code = 2


class ConfigError(LabError):
    """A config file or a --set override is unreadable, unknown, mistyped or inconsistent."""


class DataError(LabError):
    """A data set is missing, truncated, or not in the expected layout."""


class CheckpointError(LabError):
    """A checkpoint cannot be read or does not belong to this model and config."""


class LaunchError(LabError):
    """The environment cannot run what was asked (backend, devices, ports)."""
