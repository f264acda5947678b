"""The communication exercises graded for real: ring-allreduce (lesson 03), accumulate (04) and shard (05), the
learner's file under torchrun (gloo), every rank watched.

For each, the reference solution passes every check and the unchanged starter fails; each check's own mistake,
planted in a copy of the solution, fails that check alone with its hint. Each is measured on the fewest ranks that
show it (the ring's solution on 3, an odd world that three of its four sizes do not divide; the CLI's default
runs 2, 3 and 4), and a reference run is shared by the tests of its exercise, so the file stays within its two
minutes.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lab.course.exercises import folder, grading
from lab.course.exercises.accumulate import check as accumulate
from lab.course.exercises.grading import Check
from lab.course.exercises.ring_allreduce import check as ring
from lab.course.exercises.shard import check as shard
from lab.verdict import NOT_RUN

TIMEOUT = 90.0  # a run that should end takes seconds; this is only the backstop for a loaded CI machine


def planted(tmp_path: Path, exercise: str, replacements: list[tuple[str, str]]) -> Path:
    """A copy of the exercise's solution with one mistake in it (each old text must be there)."""
    text = (folder(exercise) / "solution.py").read_text()
    for old, new in replacements:
        assert old in text, old
        text = text.replace(old, new)
    path = tmp_path / f"{exercise.replace('-', '_')}.py"
    path.write_text(text)
    return path


def failed(checks: list[Check]) -> dict[str, Check]:
    return {c.name: c for c in checks if not c.passes}


# ----------------------------------------------------------------------------------------------- ring-allreduce


def test_the_ring_solution_equals_the_library_on_three_ranks_and_is_timed_beside_it():
    checks = ring.judge(ring.measure(folder("ring-allreduce") / "solution.py", TIMEOUT, worlds=(3,)))
    assert failed(checks) == {}, {c.name: c.detail for c in checks}
    measured = {c.name: c.detail for c in checks}
    assert "1, 7, 1200, 4099 floats on 3 ranks" in measured["equals dist.all_reduce for every size"]
    # the solution groups each step's send and receive (batch_isend_irecv, as NCCL needs): 2(n-1) steps a call
    assert "3 ranks: 4 grouped send/receive steps a call" in measured["only send and recv inside it"]
    assert "GB/s" in measured["bus bandwidth beside dist.all_reduce's (shown, not graded)"]


def test_the_ring_starter_fails_where_ring_all_reduce_is_not_written():
    found = failed(ring.judge(ring.measure(folder("ring-allreduce") / "starter.py", TIMEOUT, worlds=(2,))))
    assert "NotImplementedError" in found["runs on 2 ranks"].detail
    assert "NotImplementedError" in found["equals dist.all_reduce for every size"].detail


def test_a_ring_split_by_torch_chunk_is_told_why_it_breaks_and_nothing_later_blames_it(tmp_path):
    """torch.chunk gives one piece of a 1-element tensor on 2 ranks: the crash's line names the split to use."""
    path = planted(
        tmp_path,
        "ring-allreduce",
        [
            (
                "chunks = [flat[start:end] for start, end in chunk_bounds(flat.numel(), world)]",
                "chunks = list(flat.chunk(world))",
            )
        ],
    )
    checks = grading.not_measured_after_failure(ring.judge(ring.measure(path, TIMEOUT, worlds=(2,))))
    found = failed(checks)
    assert "torch.tensor_split(t, world_size)" in found["runs on 2 ranks"].fix
    assert all(c.verdict == NOT_RUN for n, c in found.items() if n != "runs on 2 ranks"), found


RING_MISTAKES = {
    "right-on-two-ranks-only": (
        [("range(world - 1)", "range(1)")],  # one step a phase: the whole ring on 2 ranks, a third of it on 3
        (3,),
        "equals dist.all_reduce for every size",
        "each call sent 2 messages, a ring 4",
    ),
    "chunks-that-drop-the-remainder": (
        [("base, extra = divmod(numel, world)", "base, extra = numel // world, 0")],
        (2,),
        "equals dist.all_reduce for every size",
        "numel % world_size one element longer",
    ),
    "the-library-inside": (
        [("    right, left = (rank + 1)", "    dist.all_reduce(tensor)\n    return\n    right, left = (rank + 1)")],
        (2,),
        "only send and recv inside it",
        "point-to-point messages",
    ),
}


@pytest.mark.parametrize("mistake", list(RING_MISTAKES))
def test_each_ring_mistake_fails_its_check_alone_with_its_hint(mistake, tmp_path):
    replacements, worlds, check_name, hint = RING_MISTAKES[mistake]
    found = failed(ring.judge(ring.measure(planted(tmp_path, "ring-allreduce", replacements), TIMEOUT, worlds)))
    assert set(found) == {check_name}, {n: c.detail for n, c in found.items()}
    assert hint in found[check_name].fix


# ----------------------------------------------------------------------------------------------- accumulate


@pytest.fixture(scope="module")
def large_batch():
    return accumulate.reference_run(TIMEOUT)


def test_the_accumulate_solution_all_reduces_once_a_step_and_reaches_the_large_batch(large_batch):
    checks = accumulate.judge(accumulate.measure(folder("accumulate") / "solution.py", TIMEOUT, large_batch))
    assert failed(checks) == {}, {c.name: c.detail for c in checks}
    assert "8 steps, each 1 all-reduce (1 bucket)" in checks[1].detail


def test_the_accumulate_starter_fails_both(large_batch):
    found = failed(accumulate.judge(accumulate.measure(folder("accumulate") / "starter.py", TIMEOUT, large_batch)))
    assert set(found) == {"one all-reduce per optimizer step", "the large batch's weights"}


ACCUMULATE_MISTAKES = {
    "no-no-sync": (
        [("with contextlib.nullcontext() if last else model.no_sync():", "with contextlib.nullcontext():")],
        "one all-reduce per optimizer step",
        "model.no_sync()",
    ),
    "loss-not-divided": (
        [("(loss / accumulate).backward()", "loss.backward()")],
        "the large batch's weights",
        "divide it by K",
    ),
}


@pytest.mark.parametrize("mistake", list(ACCUMULATE_MISTAKES))
def test_each_accumulate_mistake_fails_its_check_alone_with_its_hint(mistake, tmp_path, large_batch):
    replacements, check_name, hint = ACCUMULATE_MISTAKES[mistake]
    path = planted(tmp_path, "accumulate", replacements)
    found = failed(accumulate.judge(accumulate.measure(path, TIMEOUT, large_batch)))
    assert set(found) == {check_name}, {n: c.detail for n, c in found.items()}
    assert hint in found[check_name].fix


# ----------------------------------------------------------------------------------------------- shard

needs_fsdp = pytest.mark.skipif(shard.runs_here() is not None, reason=str(shard.runs_here()))


@pytest.fixture(scope="module")
def under_ddp():
    return shard.reference_run(TIMEOUT)


@needs_fsdp
def test_the_shard_solution_holds_half_of_ddps_state_on_ddps_curve(under_ddp):
    checks = shard.judge(shard.measure(folder("shard") / "solution.py", TIMEOUT, under_ddp))
    assert failed(checks) == {}, {c.name: c.detail for c in checks}
    assert "(0.50x, below 0.75x)" in checks[2].detail


@needs_fsdp
def test_the_shard_starter_is_the_model_left_in_ddp_and_holds_all_of_it(under_ddp):
    found = failed(shard.judge(shard.measure(folder("shard") / "starter.py", TIMEOUT, under_ddp)))
    assert set(found) == {"fully_shard on the model", "model state per rank below DDP's"}
    assert "(the model is in DDP)" in found["fully_shard on the model"].detail
    assert "(1.00x, not below" in found["model state per rank below DDP's"].detail


SHARD_MISTAKES = {
    "no-root": (
        [("    fully_shard(model)\n    return model", "    return model")],
        "fully_shard on the model",
        "fully_shard(model) on the root",
    ),
    "a-mesh-that-replicates": (  # HSDP over (2 replicas, 1 shard): fully_shard called, nothing sharded
        [
            (
                "    for layer in model:\n",
                "    from torch.distributed.device_mesh import init_device_mesh\n\n"
                '    device, replicas = "cuda" if torch.cuda.is_available() else "cpu", dist.get_world_size()\n'
                '    mesh = init_device_mesh(device, (replicas, 1), mesh_dim_names=("replicate", "shard"))\n'
                "    for layer in model:\n",
            ),
            ("fully_shard(layer)", "fully_shard(layer, mesh=mesh)"),
            ("fully_shard(model)\n", "fully_shard(model, mesh=mesh)\n"),
        ],
        "model state per rank below DDP's",
        "each rank still holds the whole model",
    ),
    "optimizer-before-fully-shard": (
        [
            ("    model = shard(build_model().to(device))\n", "    model = build_model().to(device)\n"),
            (
                "    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)\n",
                "    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)\n    shard(model)\n",
            ),
        ],
        "DDP's loss curve",
        "build the optimizer after fully_shard",
    ),
}


@needs_fsdp
@pytest.mark.parametrize("mistake", list(SHARD_MISTAKES))
def test_each_shard_mistake_fails_its_check_alone_with_its_hint(mistake, tmp_path, under_ddp):
    replacements, check_name, hint = SHARD_MISTAKES[mistake]
    found = failed(shard.judge(shard.measure(planted(tmp_path, "shard", replacements), TIMEOUT, under_ddp)))
    assert set(found) == {check_name}, {n: c.detail for n, c in found.items()}
    assert hint in found[check_name].fix
