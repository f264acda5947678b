"""The class list (lab.course.room.roster): names read from a file, a seat and a password each, the slips and the
hub's hashes written for the room's owner alone, and each wrong file refused in one line. The real hub logging a
learner in with a slip's password: tests/infra/test_room.py."""

from __future__ import annotations

import json

import bcrypt
import pytest

from lab.course.room import roster
from lab.errors import LabError


def test_each_learner_gets_a_seat_in_order_and_a_password_kept_in_clear_only_on_the_slips(tmp_path):
    path = tmp_path / "class.txt"
    path.write_text("Ada Lovelace   # front row\n\nAlan Turing\n")
    places = roster.read(path, ["seat1", "seat2", "seat3"])
    assert [(p.learner, p.seat) for p in places] == [("Ada Lovelace", "seat1"), ("Alan Turing", "seat2")]
    assert len({p.password for p in places}) == 2 and all(len(p.password) >= 12 for p in places)
    data, slips = roster.save(places, tmp_path / "room", "https://room:8000", "AB:CD")
    assert {p.stat().st_mode & 0o777 for p in (data, slips)} == {0o600}
    accounts = roster.accounts(tmp_path / "room")
    assert [a["seat"] for a in accounts] == ["seat1", "seat2"]
    for place, account in zip(places, accounts):
        assert place.password not in data.read_text()
        assert bcrypt.checkpw(place.password.encode(), account["hash"].encode())
        assert f"<code>{place.password}</code>" in slips.read_text()
    assert "https://room:8000/hub/login" in slips.read_text() and "AB:CD" in slips.read_text()
    assert roster.accounts(tmp_path / "no-room") == []
    assert json.loads(data.read_text())["accounts"][0]["learner"] == "Ada Lovelace"


@pytest.mark.parametrize(
    "text, said",
    [
        (None, "cannot be read"),
        ("# only a comment\n\n", "no learner in it"),
        ("a\nb\nc\n", "3 learners for 2 seats; plan more seats (lab room plan --seats 3)"),
        ("Ada\nada\n", "'ada' is listed twice"),
    ],
)
def test_a_wrong_class_list_is_one_line_naming_the_file(tmp_path, text, said):
    path = tmp_path / "class.txt"
    if text is not None:
        path.write_text(text)
    with pytest.raises(LabError, match=f"--class {path}: .*{said}".replace("(", r"\(").replace(")", r"\)")):
        roster.read(path, ["seat1", "seat2"])
