"""Every command a starter prints works as `lab exercise start` leaves things: typed in the checkout (or a seat's
home), where start wrote exercises/NAME.py, each torchrun line names that file and each `lab exercise check` line
finds it. (Before: four starters said `torchrun ... starter.py` and `lab exercise check fix-set-epoch starter.py`,
which exit 2, no such file.) The commands' files are resolved the way torchrun and the check resolve them; running
them is the distributed tests' (tests/distributed/test_exercise_*.py)."""

from __future__ import annotations

import ast
import re
import shlex

import pytest

from lab.course.exercises import EXERCISES, command, folder


def starter_commands(name: str) -> list[list[str]]:
    doc = ast.get_docstring(ast.parse((folder(name) / "starter.py").read_text())) or ""
    lines = [line.strip() for line in doc.splitlines() if line.strip().startswith("torchrun ")]
    lines += re.findall(r"`(lab exercise check [^`]+)`", doc)
    return [shlex.split(line) for line in lines]


@pytest.mark.parametrize("name", list(EXERCISES))
def test_each_command_a_starter_prints_finds_the_file_start_wrote(name, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert command.start(name, None) == 0
    written = tmp_path / "exercises" / f"{name.replace('-', '_')}.py"
    assert written.exists() and f"the starter is at exercises/{written.name}" in capsys.readouterr().out
    commands = starter_commands(name)
    assert any(c[0] == "torchrun" for c in commands) and any(c[:3] == ["lab", "exercise", "check"] for c in commands)
    for argv in commands:
        if argv[0] == "torchrun":
            script = next(a for a in argv[1:] if a.endswith(".py"))
            assert (tmp_path / script).resolve() == written.resolve(), (name, argv)
        else:
            assert argv[3] == name and len(argv) in (4, 5), argv
            given = tmp_path / argv[4] if len(argv) == 5 else None
            assert command.learner_file(name, given, None) == written.resolve(), (name, argv)
