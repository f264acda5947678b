"""What the observer records of a BatchNorm layer's training forwards, for fix-batchnorm's global-batch check
(lab.course.exercises.norm_batches). No GPU here: a device input is stood in for by a meta tensor, which cannot be
read at all, so a hook that read a device's sums at each forward (a host sync in the learner's step loop on a GPU)
raises here; they must wait on the device until the rank ends."""

from __future__ import annotations

import json

import torch
from torch import nn

from lab.course.exercises import norm_batches
from lab.course.exercises.recorder import Recorder


def events(folder) -> list[dict]:
    return [json.loads(line) for line in (folder / "rank-0.jsonl").read_text().splitlines()]


def test_a_cpu_forward_is_written_at_once_with_its_per_channel_sums(tmp_path):
    rec = Recorder(str(tmp_path), 0, None)
    model = nn.Sequential(nn.Linear(2, 3), nn.BatchNorm1d(3, momentum=0.2))
    norm_batches.watch(rec, 0, model)
    x = torch.tensor([[1.0, 2.0, 3.0], [3.0, 4.0, 5.0]])
    model[1](x)
    model.eval()
    model[1](x)  # evaluation moves no statistics: not recorded
    norm, batch = events(tmp_path)
    assert (norm["e"], norm["name"], norm["momentum"]) == ("norm", "1", 0.2)
    assert norm["start"]["running_var"]["values"] == [1.0, 1.0, 1.0]
    assert batch == {**batch, "e": "norm_batch", "n": 2, "sum": [4.0, 6.0, 8.0], "sumsq": [10.0, 20.0, 34.0]}


def test_a_device_forward_is_kept_on_the_device_and_read_once_at_the_end(tmp_path):
    rec = Recorder(str(tmp_path), 0, None)
    model = nn.Sequential(nn.BatchNorm1d(3))
    norm_batches.watch(rec, 0, model)
    hook = next(iter(model[0]._forward_pre_hooks.values()))
    kept = hook.__defaults__[1]  # the layer's DeviceSums
    for _ in range(3):
        hook(model[0], (torch.ones(4, 3, device="meta"),))  # reading it now would raise
    assert [e["e"] for e in events(tmp_path)] == ["norm"] and len(kept.kept) == 3
    kept.kept = [(m, n, c, torch.full((2, 3), float(i))) for i, (m, n, c, _) in enumerate(kept.kept)]  # "done"
    kept.read()
    read = [e for e in events(tmp_path) if e["e"] == "norm_batch"]
    assert [(e["n"], e["sum"]) for e in read] == [(4, [0.0] * 3), (4, [1.0] * 3), (4, [2.0] * 3)]  # in order
    assert kept.kept == []
