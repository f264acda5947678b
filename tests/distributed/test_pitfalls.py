"""`lab pitfall`: each lecture pitfall through the real CLI and real torchrun ranks, the mistake and the fix
measured. The assertions are on the numbers: the symptom in the broken run, its absence after the fix. The runs are
lesson 2's (the lesson runs the four lecture pitfalls on 2 ranks through the same CLI, once a session): these tests
read its JSON and its output rather than making the same four jobs again."""

from __future__ import annotations

import json

import pytest

from tests.conftest import lab

NAMES = ["set-epoch", "checkpoint-every-rank", "batchnorm", "uneven-batches", "cuda-visible-devices"]


def pitfall(name: str, lessons) -> tuple[dict, str]:
    """Lesson 2's run of `lab pitfall NAME` on 2 ranks (tests/lessons.py: the lesson runs once a session, and its
    notebook test asserts its checks): its JSON record and what it printed."""
    lesson = lessons("02_pitfalls")
    result = json.loads((lesson.folder("02-pitfalls") / f"{name}.json").read_text())
    printed = lesson.output_of("pitfall", name)
    assert result["pitfall"] == name and result["world_size"] == 2
    assert result["why"] and result["summary"] in printed
    return result, printed


def run_pitfall(name: str, tmp_path) -> tuple[dict, str]:
    """`lab pitfall NAME` on 2 ranks, run here (for a pitfall lesson 2 does not run on a CPU host)."""
    out = tmp_path / f"{name}.json"
    proc = lab("pitfall", name, "--nproc-per-node", "2", "--json", str(out))
    result = json.loads(out.read_text())
    assert result["pitfall"] == name and result["world_size"] == 2
    assert result["why"] and result["summary"] in proc.stdout
    return result, proc.stdout


def test_listing_names_all_five_in_teaching_order():
    proc = lab("pitfall")
    listed = [line.split()[0] for line in proc.stdout.splitlines()[1:]]
    assert listed == NAMES


def test_unknown_pitfall_is_one_line_and_exit_2():
    proc = lab("pitfall", "no-such-pitfall", check=False)
    assert proc.returncode == 2 and proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1 and "no-such-pitfall" in proc.stderr


def test_one_rank_cannot_show_a_pitfall_between_ranks():
    proc = lab("pitfall", "batchnorm", "--nproc-per-node", "1", check=False)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1 and "2 or more" in proc.stderr


def test_set_epoch_without_it_every_epoch_repeats_epoch_0(lessons, tmp_path):
    result, stdout = pitfall("set-epoch", lessons)
    broken, fixed = result["broken"], result["fixed"]
    assert broken["repeat_share"] == 1.0 and fixed["repeat_share"] == 0.0
    assert broken["distinct_orders_per_rank"] == [1, 1] and fixed["distinct_orders_per_rank"] == [5, 5]
    # Either way the ranks split the data set between them each epoch.
    assert broken["distinct_per_epoch"] == fixed["distinct_per_epoch"] == broken["samples_per_epoch"]
    for side in (broken, fixed):  # both trained: the test loss fell
        assert side["test_loss_by_epoch"][-1] < side["test_loss_by_epoch"][0]
    assert result["demonstrated"] is True and "100%" in stdout
    # the report files a pitfall's record in its own section (the workshop's report is made the same way)
    from lab.course.teaching import report
    from tests.markdown import problems

    recorded = lessons("02_pitfalls").folder("02-pitfalls") / "set-epoch.json"
    text = report.build([str(recorded)], str(tmp_path / "report")).read_text()
    assert "## Pitfalls" in text and "### set-epoch (demonstrated)" in text and problems(text) == []


def test_checkpoint_every_rank_writes_n_times_and_ddp_keys_carry_module_prefix(lessons):
    result, _ = pitfall("checkpoint-every-rank", lessons)
    broken, fixed = result["broken"], result["fixed"]
    assert broken["bytes_ratio"] == pytest.approx(2.0, abs=0.01)
    assert fixed["bytes_ratio"] == pytest.approx(1.0, abs=0.01)
    assert all(b > 0 for b in broken["bytes_written_per_rank"]) and fixed["bytes_written_per_rank"][1] == 0
    # The atomic write is never seen half done; the in-place one may be (timing): counted, not required.
    assert fixed["reader"]["loads"] > 0 and fixed["reader"]["torn"] == 0 and fixed["reader"]["wrong_contents"] == 0
    assert broken["reader"]["loads"] > 0
    assert fixed["final_file_loads"] and fixed["final_file_matches"]
    assert broken["module_prefix"]["missing_keys"] > 0 and broken["module_prefix"]["unexpected_keys"] > 0
    assert broken["module_prefix"]["first_key"].startswith("module.") and broken["module_prefix"]["strict_error"]
    for ok in (fixed["module_prefix"], fixed["module_prefix_stripped"]):
        assert ok["missing_keys"] == ok["unexpected_keys"] == 0 and ok["strict_error"] is None
    assert result["demonstrated"] is True


def test_batchnorm_ranks_keep_their_own_statistics_until_fixed(lessons):
    result, stdout = pitfall("batchnorm", lessons)
    broken, fixed = result["broken"], result["fixed"]
    assert broken["running_mean_spread"] > 0.1 and broken["running_var_spread"] > 0
    assert broken["weight_spread"] == 0  # DDP kept the weights identical: the buffers alone differ
    assert broken["test_loss_spread"] > 0  # so the same weights evaluate differently on each rank
    bb = fixed["broadcast_buffers"]
    assert bb["running_mean_spread"] == 0 and bb["running_var_spread"] == 0 and bb["test_loss_spread"] == 0
    gn = fixed["groupnorm"]
    assert gn["running_mean_spread"] is None and gn["test_loss_spread"] == 0 and gn["test_accuracy_spread"] == 0
    assert fixed["syncbatchnorm"] == {"skipped": True, "reason": "SyncBatchNorm needs CUDA in PyTorch; skipped"}
    assert "SyncBatchNorm needs CUDA in PyTorch; skipped" in stdout
    assert result["demonstrated"] is True


def test_uneven_batches_hang_until_timeout_and_each_fix_completes(lessons):
    result, stdout = pitfall("uneven-batches", lessons)
    broken, fixed = result["broken"], result["fixed"]
    assert broken["batches_per_rank"] == [5, 4] and broken["steps_per_rank"] == [4, 4]
    assert broken["timed_out"] and broken["waiting_rank"] == 0 and broken["waiting_step"] == 5
    assert "all_reduce" in broken["collective"] and "Timed out" in broken["error"]
    assert result["timeout_seconds"] <= broken["waited_seconds"] < result["timeout_seconds"] + 5
    assert "rank 1 ran out of batches after 4 steps" in stdout
    assert fixed["join"]["completed"] and fixed["join"]["steps_per_rank"] == [5, 4] and fixed["join"]["weights_equal"]
    assert fixed["pad"]["completed"] and fixed["pad"]["batches_per_rank"] == [5, 5]
    assert fixed["pad"]["samples_repeated"] == 1 and fixed["pad"]["samples_dropped"] == 0
    assert fixed["drop"]["completed"] and fixed["drop"]["batches_per_rank"] == [5, 5]
    assert fixed["drop"]["samples_dropped"] == 1 and fixed["drop"]["samples_repeated"] == 0
    assert result["demonstrated"] is True


def test_cuda_visible_devices_skips_on_a_cpu_host(tmp_path):
    pytest.importorskip("torch")
    import torch

    if torch.cuda.device_count() >= 2:
        pytest.skip("a host with GPUs measures this pitfall; the skip is for CPU hosts")
    result, stdout = run_pitfall("cuda-visible-devices", tmp_path)
    assert result["skipped"] is True and result["reason"] and result["demonstrated"] is False
    assert result["broken"]["skipped"] and result["fixed"]["skipped"]
    assert "not measured" in stdout and "demonstrated: no (skipped)" in stdout
