"""Errors a user can cause. The CLI prints their message as one line and exits 2.

Anything else that escapes is a failed run (exit 1) and keeps its traceback,
because then the traceback is what a developer needs.
"""

# The lab's exit codes (README and docs/reliability.md, Exit codes): a gate is a benchmark floor (--min-busbw) or a
# rerun's promise of bit-identical curves; incomplete is a check that failed nothing but did not run every step it
# should have (the device check: a step left out for time, not asked for, or lacking a package), so it cannot pass.
EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_GATE_MISSED, EXIT_INCOMPLETE = 0, 1, 2, 3, 4


class LabError(Exception):
    r"""Bad input: a config, an argument, a data file, a checkpoint, an inventory.

    The message is one line whatever the user typed: control characters in echoed input are escaped.

    >>> str(LabError("--set a\nb: expected section.key=value"))
    '--set a\\nb: expected section.key=value'
    """

    exit_code = 2

    def __init__(self, message: str = "") -> None:
        super().__init__("".join(c if c.isprintable() else repr(c)[1:-1] for c in str(message)))


class ConfigError(LabError):
    """A config file or a --set override is unreadable, unknown, mistyped or inconsistent."""


class DataError(LabError):
    """A data set is missing, truncated, or not in the expected layout."""


class CheckpointError(LabError):
    """A checkpoint cannot be read or does not belong to this model and config."""


class LaunchError(LabError):
    """The environment cannot run what was asked (backend, devices, ports)."""
