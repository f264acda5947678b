"""Every command, every bad input: the cases are generated from the parser itself and from the config's schema, not
listed by hand. Each is `lab ...` called in this process (lab.cli.main) from an empty folder: it must exit 2 with
at most three lines on stderr, no traceback, and leave the folder (and every path it was given) as it found it.

The cases: every subcommand's every option that takes a value, given none; an integer option given text, and one
below its minimum; a number given text; a choice that is not one; an output file that is a folder or sits under a
file; an output folder under a file; a required argument left out; and every config key given a value of the wrong
type, out of its range, or not one of its choices, plus unknown sections and keys. A case that gets past its checks
reaches an effect: the process runner, a training run and torchrun are replaced by a tripwire for the test, so such
a case fails at once instead of running (no process is started here).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import typing
from pathlib import Path

import pytest

from lab import cli
from lab.run import config

MAX_STDERR_LINES = 3


class EffectReached(Exception):
    """A command got past its checks: it was about to start a process or a run."""


def leaves(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()):
    """(the words that select it, its parser) for every subcommand that runs something."""
    groups = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not groups:
        yield prefix, parser
        return
    for group in groups:
        for name, sub in group.choices.items():
            yield from leaves(sub, (*prefix, name))


def required_words(parser: argparse.ArgumentParser, folder: Path) -> list[str]:
    """A value for each required argument, so a case fails on the one option it is about."""
    words: list[str] = []
    for action in parser._actions:
        if action.required and action.option_strings:
            words += [action.option_strings[0], str(folder / "given.json")]
    return words


def option_cases(words: tuple[str, ...], parser: argparse.ArgumentParser, folder: Path):
    """(case id, argv) for each bad value of each option of one subcommand."""
    from lab.run.config.arguments import address, executable, host_port, output_dir, output_file, plain_name, url

    base = required_words(parser, folder)
    positionals = [
        a
        for a in parser._actions
        if not a.option_strings and a.nargs not in ("?", "*", argparse.REMAINDER) and a.dest != "help"
    ]
    if positionals:  # a required argument left out
        yield f"{' '.join(words)}: no {positionals[0].dest}", [*words, *base]
    filler = [str(folder / "given")] * len(positionals)
    a_file = folder / "a-file"
    for action in parser._actions:
        if not action.option_strings or action.nargs == 0 or action.help == argparse.SUPPRESS:
            continue
        option = action.option_strings[-1]
        rest = [w for w in base if w != option]
        name = f"{' '.join(words)} {option}"
        if action.nargs is None:
            yield f"{name} (no value)", [*words, *filler, *rest, option]
        kind = action.type
        bad: list[tuple[str, str]] = []
        if hasattr(kind, "minimum"):
            bad += [("text", "many"), ("below its minimum", str(kind.minimum - 1))]  # type: ignore[union-attr]
        elif kind is int:
            bad += [("text", "many")]
        elif kind is float:
            bad += [("text", "fast")]
        if action.choices is not None:
            bad += [("not a choice", "no-such-choice")]
        if kind is output_file:
            bad += [("a folder", str(folder)), ("under a file", str(a_file / "out.json"))]
        elif kind is output_dir:
            bad += [("under a file", str(a_file / "sub"))]
        elif kind is host_port:
            bad += [("not HOST:PORT", "gateway")]
        elif kind is address:
            bad += [("not an address", "nowhere:8000")]
        elif kind is url:
            bad += [("not a URL", "not a url")]
        elif kind is plain_name:
            bad += [("empty", "")]
        elif kind is executable:
            bad += [("no such program", str(folder / "missing" / "program"))]
        for what, value in bad:
            yield f"{name} ({what})", [*words, *filler, *rest, option, value]


# Options whose value is text the command reads itself (a size, a list, an address): one wrong value each, as a
# user would mistype it. A new free-text option gets a row here, or test_every_free_text_option_has_a_bad_value fails.
FREE_TEXT = {
    "--class": "not a class",
    "--minbytes": "lots",
    "--maxbytes": "-1M",
    "--size": "big",
    "--link": "no-such-link",
    "--pushgateway": "no-port-here",
    "--rows": "NOPE",
    "--only": "no-such-part",
    "--nnodes": "0",
    "--rdzv-endpoint": "nohostport",
    "--rdzv-id": "bad id/with spaces",
    "--local-addr": "not an address",
    "--devices": ",,,",
    "--prefix": "Bad-Prefix!",
    "--room-dir": "{a_file}/room",
    "--plan": "{missing}/plan.json",
    "--bind": "nowhere:port",
    "--proxy": "{missing}/configurable-http-proxy",
    "--home-root": "{a_file}/homes",
    "--prometheus-url": "not a url",
    "--tls-cert": "{missing}/room.pem",
    "--tls-key": "{missing}/room-key.pem",
    "--image": "",
    "--network": "",
    "--hub-bind": "nowhere:port",
    "--hub-connect-url": "not a url",
    "--port": "99999",
    "--nodes": "",
    "--run-id": "bad id/with spaces",
    "--floor": "pair=fast",
    "--expect": "nokey=1",
    "--baseline": "{missing}/baseline.json",
    "--baseline-fraction": "2",
    "--config": "{missing}/config.yaml",
    "--set": "train.lr=fast",
    "--device-checks": "{missing}/device-check",
    "--recap": "{missing}/recap.log",
    "--platform": "no-such-platform",
}
# Positional arguments that name something: a value that names nothing.
POSITIONALS = {
    "run_dir": "{missing}",
    "collectives": "all_reduse",
    "name": "no-such-pitfall",
    "paths": "{missing}",
    "seat": "seat99",
    "home": "{a_file}/home",
    "folder": "{missing}",
}


# ... and a value each that is right enough, so a wrong option after them is what is refused
VALID_POSITIONALS = {
    "run_dir": "{folder}",
    "collectives": "all_reduce",
    "name": "set-epoch",
    "paths": "{folder}",
    "seat": "seat1",
    "home": "{folder}/home",
    "folder": "{folder}",
}


def free_text_cases(words: tuple[str, ...], parser: argparse.ArgumentParser, folder: Path):
    places = {"missing": folder / "missing", "a_file": folder / "a-file"}
    base = required_words(parser, folder)
    positionals = [a for a in parser._actions if not a.option_strings and a.dest in POSITIONALS]
    values = {a.dest: POSITIONALS[a.dest].format(**places) for a in positionals}
    for action in positionals:  # each positional wrong alone, the others left out or right enough
        yield f"{' '.join(words)}: {action.dest} names nothing", [*words, values[action.dest], *base]
    fillers = [VALID_POSITIONALS[a.dest].format(folder=folder) for a in positionals if a.nargs in (None, "+")]
    for action in parser._actions:
        option = action.option_strings[-1] if action.option_strings else None
        if option in FREE_TEXT and action.type is None and action.choices is None:
            rest = [w for w in base if w != option]
            yield (
                f"{' '.join(words)} {option} (wrong)",
                [*words, *fillers, *rest, option, FREE_TEXT[option].format(**places)],
            )


def _hint(cls: type, name: str):
    return typing.get_type_hints(cls)[name]


def config_cases():
    """(case id, the --set value) for every config key: a value of the wrong type, out of range, not a choice."""
    yield "unknown section", "nosuch.key=1"
    yield "unknown key", "train.learning_rate=0.1"
    yield "no value", "train.lr"
    for section, cls in config.SECTIONS.items():
        for f in dataclasses.fields(cls):
            hint, meta, key = _hint(cls, f.name), f.metadata, f"{section}.{f.name}"
            if meta.get("choices") or typing.get_origin(hint) is typing.Literal:
                yield f"{key} (not a choice)", f"{key}=no-such-choice"
            elif hint is bool:
                yield f"{key} (not a boolean)", f"{key}=maybe"
            elif hint in (int, float):
                yield f"{key} (text)", f"{key}=many"
                if hint is int:
                    yield f"{key} (a fraction)", f"{key}=1.5"
                if meta.get("min") is not None:
                    yield f"{key} (below its minimum)", f"{key}={meta['min'] - 1}"
                if meta.get("max") is not None:
                    yield f"{key} (above its maximum)", f"{key}={meta['max'] + 1}"


def tree(folder: Path) -> dict[str, tuple[int, int]]:
    """Every path under `folder` with its size and modification time: what a refused command must not change."""
    return {str(p.relative_to(folder)): (p.lstat().st_size, p.lstat().st_mtime_ns) for p in folder.rglob("*")}


@dataclasses.dataclass
class Refusal:
    code: int | None
    stderr: str
    changed: list[str]
    effect: str | None = None

    def problems(self) -> list[str]:
        found = []
        if self.effect:
            found.append(f"got past its checks: {self.effect}")
        if self.code != 2:
            found.append(f"exit {self.code}, not 2")
        lines = self.stderr.strip().splitlines()
        if not lines or len(lines) > MAX_STDERR_LINES:
            found.append(f"{len(lines)} line(s) on stderr: {self.stderr[-500:]!r}")
        if "Traceback" in self.stderr:
            found.append("a traceback")
        if self.changed:
            found.append(f"left behind or changed: {self.changed}")
        return found


def refuse(argv: list[str], folder: Path, capsys, monkeypatch) -> Refusal:
    """`lab ARGV` in this process from `folder`, every effect a tripwire: its exit, stderr and what it changed."""
    from lab.run.cluster import launch, runner
    from lab.run.training import lifecycle

    def tripwire(what: str):
        def reached(*args, **kwargs):
            raise EffectReached(what)

        return reached

    monkeypatch.setattr(runner, "run", tripwire("the process runner"))
    monkeypatch.setattr(runner, "start", tripwire("the process runner"))
    monkeypatch.setattr(launch, "run", tripwire("torchrun"))
    monkeypatch.setattr(lifecycle, "run", tripwire("a training run"))
    monkeypatch.chdir(folder)
    before = tree(folder)
    capsys.readouterr()
    effect, raised = None, ""
    try:
        code = cli.main(argv)
    except EffectReached as exc:
        code, effect = None, str(exc)
    except SystemExit as exc:  # --help and --version exit through argparse; no case asks for them
        code = int(exc.code or 0)
    except Exception as exc:
        code, raised = None, f"Traceback (an escaped {type(exc).__name__}: {exc})"
    stderr = capsys.readouterr().err + raised
    after = tree(folder)
    changed = sorted(p for p in after if before.get(p) != after[p]) + sorted(p for p in before if p not in after)
    return Refusal(code, stderr, changed, effect)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    here = tmp_path / "cwd"
    here.mkdir()
    (here / "a-file").write_text("a file, not a folder\n")
    return here


def all_option_cases(folder: Path) -> list[tuple[str, list[str]]]:
    return [case for words, parser in leaves(cli.build_parser()) for case in option_cases(words, parser, folder)]


def test_every_option_of_every_command_refuses_its_bad_values_in_one_line_leaving_nothing(folder, capsys, monkeypatch):
    cases = all_option_cases(folder)
    commands = {" ".join(words) for words, _ in leaves(cli.build_parser())}
    assert len(commands) >= 27 and len(cases) > 250, (len(commands), len(cases))  # the generator found the surface
    covered = {case_id.split(" -")[0].split(":")[0] for case_id, _ in cases}
    assert commands <= covered | {c for c in commands if not c}, commands - covered
    failures = [
        f"lab {' '.join(argv)}  [{case_id}]: {'; '.join(problems)}"
        for case_id, argv in cases
        if (problems := refuse(argv, folder, capsys, monkeypatch).problems())
    ]
    assert not failures, f"{len(failures)} of {len(cases)} cases:\n" + "\n".join(failures)


def test_every_free_text_option_and_named_argument_refuses_a_wrong_value(folder, capsys, monkeypatch):
    cases = [c for words, parser in leaves(cli.build_parser()) for c in free_text_cases(words, parser, folder)]
    assert len(cases) > 40, len(cases)
    failures = [
        f"lab {' '.join(argv)}  [{case_id}]: {'; '.join(problems)}"
        for case_id, argv in cases
        if (problems := refuse(argv, folder, capsys, monkeypatch).problems())
    ]
    assert not failures, f"{len(failures)} of {len(cases)} cases:\n" + "\n".join(failures)


def test_every_free_text_option_has_a_bad_value():
    """A new option that takes text (not a typed one) needs its wrong value in FREE_TEXT, so it is tried."""
    untried = sorted(
        {
            f"lab {' '.join(words)} {a.option_strings[-1]}"
            for words, parser in leaves(cli.build_parser())
            for a in parser._actions
            if a.option_strings
            and a.nargs != 0
            and a.type is None
            and a.choices is None
            and a.help != argparse.SUPPRESS
            and a.option_strings[-1] not in FREE_TEXT
            and not a.required
        }
    )
    assert not untried, untried


def test_every_config_key_refuses_a_wrong_value_in_one_line_leaving_nothing(folder, capsys, monkeypatch):
    cases = list(config_cases())
    keys = {f"{s}.{f.name}" for s, cls in config.SECTIONS.items() for f in dataclasses.fields(cls)}
    assert len(cases) > len(keys), len(cases)
    failures = []
    for case_id, item in cases:
        for command in (["train", "--config", "smoke"], ["bench", "levers", "--nproc-per-node", "2"]):
            argv = [*command, "--set", item]
            if problems := refuse(argv, folder, capsys, monkeypatch).problems():
                failures.append(f"lab {' '.join(argv)}  [{case_id}]: {'; '.join(problems)}")
    assert not failures, f"{len(failures)} of {2 * len(cases)} cases:\n" + "\n".join(failures)


# ----------------------------------------------------------------------------- the cases found by hand first


def test_a_refused_run_leaves_no_run_directory(folder, capsys, monkeypatch):
    (folder / "weights.pt").write_text("these are not weights")
    for item, said in (
        ("checkpoint.resume=/nonexistent/last.pt", "checkpoint.resume: /nonexistent/last.pt does not exist"),
        ("data.synthetic_train_size=3", "is larger than a rank's share of the training set"),
        ("checkpoint.resume=weights.pt", "weights.pt is not a checkpoint written by lab (or by torch.save)"),
    ):
        refusal = refuse(["train", "--config", "smoke", "--set", item], folder, capsys, monkeypatch)
        assert refusal.problems() == [] and said in refusal.stderr, (item, refusal)
        assert not (folder / "runs").exists()


def test_a_device_list_that_names_nothing_is_refused(folder, capsys, monkeypatch):
    refusal = refuse(["room", "plan", "--devices", ",,,", "--seats", "2"], folder, capsys, monkeypatch)
    assert refusal.problems() == [] and "--devices ',,,': an empty entry" in refusal.stderr


def test_data_synth_into_a_place_that_cannot_be_made_is_one_line(folder, capsys, monkeypatch):
    refusal = refuse(["data", "synth", "--root", "/proc/lab/data"], folder, capsys, monkeypatch)
    assert refusal.problems() == [] and "cannot be made: /proc is not writable" in refusal.stderr


@pytest.mark.parametrize(
    "command",
    [
        ["room", "plan", "--gpus", "8", "--cores", "224", "--memory", "2000", "--seats", "3"],
        ["memory", "--params", "7e9", "--world-size", "8"],
    ],
)
def test_output_piped_into_a_reader_that_stops_early_ends_quietly(tmp_path, command):
    """A real process whose stdout is a pipe closed after the first line (`| head -1`): 141, as a shell expects
    of a command that lost its reader, and nothing on stderr."""
    import subprocess

    read, write = os.pipe()
    proc = subprocess.Popen(
        [sys.executable, "-m", "lab", *command], stdout=write, stderr=subprocess.PIPE, cwd=tmp_path, text=True
    )
    os.close(write)
    with os.fdopen(read) as pipe:
        first = pipe.readline()
    stderr = proc.communicate(timeout=60)[1]
    assert first and proc.returncode in (0, 141) and stderr == "", (proc.returncode, stderr)


def test_the_surface_test_catches_a_command_that_makes_its_folder_before_a_check(folder, capsys, monkeypatch):
    """A planted regression: `lab data synth` making its folder, then refusing. The harness names what it left."""
    from lab.errors import LabError
    from lab.run import commands

    def makes_then_refuses(args):
        Path(args.root).mkdir(parents=True)
        raise LabError("--train-size: refused after the folder was made")

    monkeypatch.setattr(commands, "data_synth", makes_then_refuses)  # the parser's table reads it when built
    refusal = refuse(["data", "synth", "--root", "planted"], folder, capsys, monkeypatch)
    assert refusal.code == 2 and "planted" in refusal.changed, refusal
    assert any("left behind" in p for p in refusal.problems())
