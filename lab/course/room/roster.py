"""The class list: learners' names from a file, each given a seat and a password before the room opens, and the
slips the instructor prints (`lab room serve --class FILE`). Nobody signs up or waits to be authorized: each
learner logs in with the seat and password on their slip.

The file is one learner a line (`#` starts a comment, blank lines are skipped); seats are handed out in the plan's
order. The passwords are made here, kept in clear only on the slips (`slips.html`, in the room's folder, which is
the room owner's alone) and given to the hub as bcrypt hashes (`class.json`): the room's authenticator makes each
seat's account from them when it starts (lab.course.room.hub.RoomAuthenticator).

>>> learners("# room 2\\nAda Lovelace\\n\\nAlan Turing\\n", "class.txt")
['Ada Lovelace', 'Alan Turing']
"""

from __future__ import annotations

import html
import json
import secrets
from dataclasses import dataclass
from pathlib import Path

from lab import atomic
from lab.errors import LabError

CLASS_FILE = "class.json"  # in the room's folder: each seat's learner and password hash, for the hub
SLIPS_FILE = "slips.html"  # in the room's folder: one slip a learner, to print and hand out


@dataclass(frozen=True)
class Place:
    learner: str
    seat: str
    password: str  # in clear: for the slip only, never written to class.json


def learners(text: str, source: str) -> list[str]:
    """The names in a class list's text; LabError naming `source` where one is given twice."""
    names = [line.split("#", 1)[0].strip() for line in text.splitlines()]
    names = [n for n in names if n]
    seen: set[str] = set()
    for name in names:
        if name.lower() in seen:
            raise LabError(f"{source}: {name!r} is listed twice; one line a learner (add an initial to tell two apart)")
        seen.add(name.lower())
    return names


def read(path: str | Path, seats: list[str]) -> list[Place]:
    """The class list at `path`, a learner a seat in the plan's order, each with a new password. LabError in one
    line: a file that cannot be read, no names, more learners than seats."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise LabError(
            f"--class {path}: cannot be read ({exc.strerror}); give a text file, one learner a line"
        ) from None
    except UnicodeDecodeError:
        raise LabError(f"--class {path}: not text; give a text file, one learner a line") from None
    names = learners(text, f"--class {path}")
    if not names:
        raise LabError(f"--class {path}: no learner in it; one name a line (# starts a comment)")
    if len(names) > len(seats):
        raise LabError(
            f"--class {path}: {len(names)} learners for {len(seats)} seats; plan more seats (lab room plan --seats "
            f"{len(names)}) or seat some in pairs"
        )
    return [Place(name, seat, secrets.token_urlsafe(9)) for name, seat in zip(names, seats)]


def save(places: list[Place], folder: Path, url: str, fingerprint: str = "") -> tuple[Path, Path]:
    """class.json for the hub (hashes) and the slips to print (clear), both the owner's alone."""
    import bcrypt

    accounts = [
        {"learner": p.learner, "seat": p.seat, "hash": bcrypt.hashpw(p.password.encode(), bcrypt.gensalt()).decode()}
        for p in places
    ]
    data, slips = folder / CLASS_FILE, folder / SLIPS_FILE
    atomic.write_text(data, json.dumps({"accounts": accounts}, indent=1) + "\n", mode=0o600)
    atomic.write_text(slips, page(places, url, fingerprint), mode=0o600)
    return data, slips


def accounts(folder: Path) -> list[dict[str, str]]:
    """What the hub makes at its start: each seat's name and password hash (none where the room has no class)."""
    try:
        return list(json.loads((Path(folder) / CLASS_FILE).read_text())["accounts"])
    except FileNotFoundError:
        return []


def page(places: list[Place], url: str, fingerprint: str = "") -> str:
    """The slips: one box a learner (name, the room's address, seat, password), to print and cut."""
    check = (
        f"<p class=f>Your browser will warn about the room's certificate: accept it only if its SHA-256 fingerprint "
        f"is<br><code>{html.escape(fingerprint)}</code></p>"
        if fingerprint
        else ""
    )
    boxes = "\n".join(
        f"<div class=slip><h2>{html.escape(p.learner)}</h2><p>{html.escape(url)}/hub/login</p>"
        f"<p>user <b>{html.escape(p.seat)}</b> &nbsp; password <b><code>{html.escape(p.password)}</code></b></p>"
        f"{check}</div>"
        for p in places
    )
    style = (
        "body{font-family:sans-serif} .slip{border:1px dashed #888;padding:8px 14px;margin:6px;"
        "break-inside:avoid} h2{margin:4px 0} code{font-size:1.1em} .f{font-size:.8em}"
    )
    return f"<!doctype html><meta charset=utf-8><title>the room's slips</title><style>{style}</style>\n{boxes}\n"
