"""The workshop seat this process runs in: LAB_SEAT, which the room's spawner sets for a learner's server (and so
for every lesson command and run it starts), read in this one place. torch-free.

A seat's runs carry it as the `seat` label in Prometheus (file_sd targets, the Pushgateway's groups) and in its
lessons' check records, so the instructor's views tell twenty learners' `run.id=baseline` apart.

>>> seat({"LAB_SEAT": "seat3"}), seat({}), seat({"LAB_SEAT": ""})
('seat3', None, None)
>>> labels({"LAB_SEAT": "seat3"}), labels({})
({'seat': 'seat3'}, {})
"""

from __future__ import annotations

import os
from collections.abc import Mapping

ENV = "LAB_SEAT"


def seat(env: Mapping[str, str] | None = None) -> str | None:
    """The seat's name, or None outside a room."""
    value = (os.environ if env is None else env).get(ENV, "").strip()
    return value or None


def labels(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """{'seat': name} in a room, {} outside one: what a target or a pushed group adds."""
    name = seat(env)
    return {"seat": name} if name else {}


def file_prefix(env: Mapping[str, str] | None = None) -> str:
    """What a file shared by every seat (a file_sd target in the room's targets folder) starts with, so two seats'
    runs of the same id do not overwrite each other's.

    >>> file_prefix({"LAB_SEAT": "seat3"}), file_prefix({})
    ('seat3-', '')
    """
    name = seat(env)
    return f"{name}-" if name else ""
