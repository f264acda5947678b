"""The `convert` exercise graded for real: the learner's file under torchrun (gloo), every rank watched.

The reference solution passes every check and the unchanged starter fails; each check's own mistake, planted in a
copy of the solution, fails that check with its hint while the others hold (measured on the fewest ranks that show
it, so the file stays within its minutes); a rank left waiting in a collective is stopped at the timeout, named,
and nothing of the run is left.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from lab.course.exercises import folder, grading
from lab.course.exercises.convert import check as convert
from lab.course.exercises.grading import Check
from lab.verdict import NOT_RUN
from tests.conftest import lab, run

SOLUTION = folder("convert") / "solution.py"
STARTER = folder("convert") / "starter.py"
TIMEOUT = 90.0  # a run that should end takes seconds; this is only the backstop for a loaded CI machine


@pytest.fixture(scope="module")
def reference():
    with tempfile.TemporaryDirectory() as tmp:
        return convert.reference_run(Path(tmp), TIMEOUT)


def planted(tmp_path: Path, old: str, new: str, *more: tuple[str, str]) -> Path:
    """A copy of the solution with one mistake in it (`old` replaced by `new`, and any `more` such pairs)."""
    text = SOLUTION.read_text()
    for a, b in ((old, new), *more):
        assert a in text, a
        text = text.replace(a, b)
    path = tmp_path / "convert.py"
    path.write_text(text)
    return path


def failed(checks: list[Check]) -> dict[str, Check]:
    return {c.name: c for c in checks if not c.passes}


def grade(path: Path, reference, worlds=(2,), resume: bool = False, timeout: float = TIMEOUT) -> list[Check]:
    return convert.judge(convert.measure(path, timeout, worlds=worlds, resume=resume, reference=reference))


def test_the_documented_commands_start_it_and_grade_the_solution_and_record_it_for_the_room(tmp_path):
    """docs/exercises.md's commands as typed, in a folder like a checkout: the starter copied, a learner's finished
    work (the reference solution) graded, every check held, the outcome kept where `lab room status` reads it."""
    (tmp_path / ".venv").symlink_to(Path(sys.executable).parent.parent)
    for command in (".venv/bin/lab exercise list", ".venv/bin/lab exercise start convert"):
        run(shlex.split(command), cwd=tmp_path)
    mine = tmp_path / "exercises" / "convert.py"
    assert mine.read_text() == STARTER.read_text()
    shutil.copyfile(SOLUTION, mine)  # the learner's TODOs done
    done = run(shlex.split(".venv/bin/lab exercise check convert"), cwd=tmp_path)
    assert "[x] runs on 3 ranks: 3 ranks over gloo ended cleanly" in done.stdout
    assert "[x] a resume continues the curve" in done.stdout and "10 of 10 checks hold" in done.stdout, done.stdout
    record = json.loads((tmp_path / "runs" / "lessons" / "exercises" / "convert.json").read_text())
    assert record["verdict"] == "held" and record["counts"] == {"held": 10} and len(record["checks"]) == 10
    assert [c["name"] for c in record["checks"]][:2] == ["runs on 2 ranks", "runs on 3 ranks"]


def test_the_unchanged_starter_fails_where_it_is_not_yet_distributed(reference):
    found = failed(grade(STARTER, reference))
    # Its ranks all write one checkpoint through one temporary name: a rank's os.replace may lose the race and end
    # the run, which fails the checks that need a whole run too. These three fail however the race goes.
    assert {
        "the model in DistributedDataParallel",
        "each rank its own share of every epoch",
        "rank 0 alone writes the checkpoint",
    } <= set(found)
    assert "every rank reads the whole data set" in found["each rank its own share of every epoch"].fix


MISTAKES = {
    "no-set-epoch": (
        "        self.train_data.sampler.set_epoch(epoch)",
        "        pass",
        "a new order each epoch",
        "set_epoch(epoch)",
    ),
    "every-rank-saves": (  # each to a file of its own first, so the race does not crash the run before it counts
        "                if dist.get_rank() == 0:  # every rank holds the same weights: one writer\n"
        "                    self._save_checkpoint(epoch)",
        "                self._save_checkpoint(epoch)",
        "rank 0 alone writes the checkpoint",
        "dist.get_rank() == 0",
        ('tmp = path + ".tmp"', 'tmp = f"{path}.{dist.get_rank()}.tmp"'),
    ),
    "module-prefix": (
        '"model": self.model.module.state_dict()',
        '"model": self.model.state_dict()',
        "the checkpoint loads into the plain model",
        "model.module.state_dict()",
    ),
    "data-parallel": (
        'self.model = DDP(self.model, device_ids=[device.index] if device.type == "cuda" else None)',
        "self.model = torch.nn.DataParallel(self.model)",
        "the model in DistributedDataParallel",
        "DataParallel is one process",
    ),
    "rank-0s-own-loss": (
        "            dist.all_reduce(loss)  #",
        "            loss *= dist.get_world_size()  #",
        "the printed loss is the mean over ranks",
        "dist.all_reduce",
    ),
    "whole-batch-per-rank": (
        "args.batch_size // dist.get_world_size()",
        "args.batch_size",
        "the single-device curve at the same global batch",
        "batch_size // world_size",
    ),
}


@pytest.mark.parametrize("mistake", list(MISTAKES))
def test_each_planted_mistake_fails_its_check_alone_with_its_hint(mistake, tmp_path, reference):
    old, new, check_name, hint, *more = MISTAKES[mistake]
    found = failed(grade(planted(tmp_path, old, new, *more), reference))
    assert set(found) == {check_name}, {n: c.detail for n, c in found.items()}
    assert hint in found[check_name].fix


def test_a_share_of_the_batch_hard_coded_for_two_ranks_fails_on_three(tmp_path, reference):
    path = planted(tmp_path, "args.batch_size // dist.get_world_size()", "args.batch_size // 2")
    found = failed(grade(path, reference, worlds=(3,)))
    assert set(found) == {"the single-device curve at the same global batch"}
    assert "6 optimizer steps per epoch on 3 ranks, 8 on one device" in found[next(iter(found))].detail


def test_a_resume_that_restarts_from_epoch_zero_fails_the_resume_check(tmp_path, reference):
    path = planted(tmp_path, '        self.epochs_run = checkpoint["epochs_run"]\n', "")
    found = failed(grade(path, reference, resume=True))
    assert set(found) == {"a resume continues the curve"}
    assert "epochs_run" in found["a resume continues the curve"].fix


def test_a_rank_left_waiting_in_a_collective_is_stopped_named_and_nothing_is_left(
    tmp_path, reference, capsys, monkeypatch
):
    path = planted(
        tmp_path,
        "    dist.destroy_process_group()",
        "    if dist.get_rank() == 1:\n        dist.barrier()  # rank 1 alone: rank 0 never comes\n"
        "    else:\n        __import__('time').sleep(600)  # rank 0 alive, elsewhere\n"
        "    dist.destroy_process_group()",
    )
    monkeypatch.setattr(grading, "STALL_SECONDS", 5.0)  # the room's 30 s, shortened
    checks = grade(path, reference, worlds=(2, 3), timeout=TIMEOUT)
    by_name = {c.name: c for c in checks}
    runs = by_name["runs on 2 ranks"]
    assert not runs.passes and runs.fix == grading.HANG_HINT
    # stopped when the traces stood still with a rank in a collective, not at the limit
    assert runs.detail.startswith("2 ranks made no progress for 5 s and was stopped: "), runs.detail
    # the next world size is not started: a hang is the learner's at any size, and would cost the limit again
    assert by_name["runs on 3 ranks"].verdict == NOT_RUN
    assert by_name["runs on 3 ranks"].detail == "not run: it hung on 2 ranks"
    assert "SignalException" not in capsys.readouterr().err  # the grader's own stop is not the learner's error
    line = path.read_text().splitlines().index("        dist.barrier()  # rank 1 alone: rank 0 never comes") + 1
    assert "rank 1 waits in barrier #" in runs.detail and f"convert.py:{line} in main" in runs.detail
    asleep = path.read_text().splitlines().index("        __import__('time').sleep(600)  # rank 0 alive, elsewhere") + 1
    assert f"rank 0 never came (at convert.py:{asleep} in main)" in runs.detail
    survivors = subprocess.run(["pgrep", "-f", str(path)], capture_output=True, text=True).stdout.split()
    assert survivors == [], f"processes of the hung run left: {survivors}"


def test_a_rank_blocked_inside_ddps_forward_is_named_at_its_line(tmp_path, reference, monkeypatch):
    """The loss all-reduced by rank 0 alone: rank 1 goes on to the next step, whose DDP forward blocks in torch's C++
    (no Python runs there, so no record and no SIGTERM handler sees it). The grader asks each rank's stack first
    (faulthandler on SIGWINCH, lab.course.exercises.stacks): rank 1 is named at its forward's line, not "unknown"."""
    path = planted(
        tmp_path,
        "            dist.all_reduce(loss)  #",
        "            if dist.get_rank() == 0:\n                dist.all_reduce(loss)  #",
    )
    monkeypatch.setattr(grading, "STALL_SECONDS", 5.0)  # the room's 30 s, shortened
    runs = {c.name: c for c in grade(path, reference)}["runs on 2 ranks"]
    forward = next(i for i, t in enumerate(path.read_text().splitlines(), 1) if "self.model(source)" in t)
    assert "rank 0 waits in all_reduce #" in runs.detail, runs.detail
    assert f"rank 1 never came (at convert.py:{forward} in _run_batch, inside torch's Distributed" in runs.detail


def test_a_sampler_given_shuffle_too_is_named_and_no_later_check_blames_a_consequence(tmp_path, reference):
    """The crash's own line says what to do; the checks that could not be measured say so, not "DDP wrapped the
    model on 0 of 2 ranks" or "rank 0 saved nothing"."""
    path = planted(
        tmp_path,
        "DataLoader(dataset, batch_size=batch_size, sampler=sampler)",
        "DataLoader(dataset, batch_size=batch_size, sampler=sampler, shuffle=True)",
    )
    checks = grading.not_measured_after_failure(grade(path, reference))
    found = failed(checks)
    assert "takes no shuffle=True" in found["runs on 2 ranks"].fix
    later = {n: c for n, c in found.items() if n != "runs on 2 ranks"}
    assert later and all(c.verdict == NOT_RUN and c.detail.startswith("not measured: ") for c in later.values())


def gloo_has_avg() -> bool:
    """Whether this torch's gloo takes ReduceOp.AVG (later releases do), asked of a real one-rank gloo group."""
    probe = (
        "import tempfile, torch, torch.distributed as d\n"
        "d.init_process_group('gloo', init_method='file://' + tempfile.mktemp(), rank=0, world_size=1)\n"
        "try: d.all_reduce(torch.ones(1), op=d.ReduceOp.AVG); print('yes')\n"
        "except RuntimeError: print('no')"
    )
    return subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True).stdout.strip() == "yes"


def test_reduce_op_avg_passes_where_gloo_has_it_and_is_named_with_what_to_do_where_it_has_not(tmp_path, reference):
    """The loss averaged with ReduceOp.AVG in place of sum-then-divide: right where gloo takes AVG (the pinned
    torch), a crash on the lowest torch whose own line says what to do, and no later check blamed for it."""
    path = planted(
        tmp_path,
        "dist.all_reduce(loss)  #",
        "dist.all_reduce(loss, op=dist.ReduceOp.AVG)  #",
        ("loss.item() / dist.get_world_size()", "loss.item()"),
    )
    found = failed(grading.not_measured_after_failure(grade(path, reference)))
    if gloo_has_avg():
        assert not found, found
        return
    assert "has no ReduceOp.AVG" in found["runs on 2 ranks"].fix, found["runs on 2 ranks"]
    assert all(c.detail.startswith("not measured: ") for n, c in found.items() if n != "runs on 2 ranks"), found


def test_start_copies_the_starter_once_and_check_refuses_bad_input_in_one_line(tmp_path):
    done = lab("exercise", "start", "convert", "--dir", str(tmp_path))
    mine = tmp_path / "convert.py"
    assert mine.read_text() == STARTER.read_text()
    mine.write_text(mine.read_text() + "# my work\n")
    again = lab("exercise", "start", "convert", "--dir", str(tmp_path))
    assert "already at" in again.stdout and mine.read_text().endswith("# my work\n"), done.stdout
    (tmp_path / "notes.py").write_bytes(b"\x00\x01binary")
    for args, says in (
        (["check", "nope"], "invalid choice: 'nope'"),
        (["check", "convert", str(tmp_path / "absent.py")], "absent.py: no such file"),
        (["check", "convert", str(tmp_path / "notes.py")], "notes.py: not Python"),
        (["check", "convert", "--dir", str(tmp_path / "empty")], "lab exercise start convert puts the starter there"),
    ):
        refused = lab("exercise", *args, check=False)
        assert refused.returncode == 2 and says in refused.stderr, refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1 and "Traceback" not in refused.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["convert.py", "notes.py"]  # a refusal writes nothing
