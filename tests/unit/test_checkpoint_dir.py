"""checkpoint.dir: checkpoints apart from the run directory, so a restart on another node resumes.

The Ansible launch role passes lab_checkpoint_dir as --set checkpoint.dir=DIR; on a cluster DIR is a file system
every node mounts. Here two "nodes" are two output folders on one disk and the shared folder a third.
"""

from __future__ import annotations

import json

import pytest
import torch

from lab.errors import LabError
from lab.run import config
from lab.run.training import checkpoint
from lab.run.training import lifecycle as train


@pytest.fixture(autouse=True)
def one_thread(monkeypatch):
    """One intra-op thread (lab.run.cluster.dist reads OMP_NUM_THREADS): a 16-image step of a width-8 ResNet is faster
    alone than contended on 2 cores; the process's thread count is restored after."""
    before = torch.get_num_threads()
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    yield
    torch.set_num_threads(before)


def _start(tmp_path, node: str, *overrides: str) -> dict:
    cfg = config.load(
        "smoke",
        [
            "model.width=8",
            "run.id=job",
            f"run.output_dir={tmp_path / node}",
            f"checkpoint.dir={tmp_path / 'shared'}",
            "train.max_steps=4",
            "train.global_batch_size=16",
            "data.synthetic_train_size=128",
            "data.synthetic_test_size=32",
            *overrides,
        ],
    )
    return train.run(cfg)


def test_a_restart_whose_rank_0_lands_on_another_node_resumes_from_checkpoint_dir(tmp_path):
    stopped = _start(tmp_path, "node-a", "train.stop_after_steps=2")
    assert stopped["status"] == "stopped" and stopped["steps"] == 2
    shared = tmp_path / "shared" / "job" / checkpoint.LAST
    assert shared.is_file()  # written to checkpoint.dir/<run id>/, not into node-a's run directory
    assert not (tmp_path / "node-a" / "job" / "checkpoints" / checkpoint.LAST).exists()

    # node-b has never seen this run: its run directory is new, the checkpoint is found in the shared folder
    resumed = _start(tmp_path, "node-b")
    assert resumed["status"] == "completed" and resumed["steps"] == 4
    start = json.loads((tmp_path / "node-b" / "job" / "manifest.json").read_text())["starts"][0]
    assert start["step"] == 2 and start["resumed_from"] == str(shared)
    assert checkpoint.load(shared)["progress"]["step"] == 4  # the finished run saved there too


def test_an_unwritable_checkpoint_dir_is_refused_naming_the_key(tmp_path):
    (tmp_path / "a-file").write_text("")
    with pytest.raises(LabError, match=r"^checkpoint.dir: cannot write to .*a-file/job \(.*\); choose a writable"):
        checkpoint.prepare_folder(checkpoint.run_folder(str(tmp_path / "a-file"), "job", tmp_path / "unused"))
