"""A learner on a laptop: every word of the course is defined, lesson 1 points to the glossary and to the one
readable DDP script, and JupyterLab's terminal finds `lab` as the lessons write it."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest

from tests.conftest import ROOT

GLOSSARY = ROOT / "docs" / "glossary.md"
LESSON_1 = ROOT / "notebooks" / "01_baseline_and_ddp.py"

# Each a word the lessons, the docs or the lab's output use without saying what it is.
TERMS = [
    "rank", "local rank", "world size", "node", "process group", "backend", "gloo", "NCCL", "torchrun", "c10d",
    "rendezvous", "DDP", "bucket", "all-reduce", "all-gather", "reduce-scatter", "broadcast", "ring", "tree",
    "algbw", "busbw", "FSDP", "FSDP2", "ZeRO-1", "ZeRO-2", "ZeRO-3", "DeepSpeed", "Horovod", "sharding",
    "DistributedSampler", "set_epoch", "BatchNorm", "SyncBatchNorm", "gradient accumulation", "no_sync",
    "mixed precision", "bf16", "strong and weak scaling", "speedup", "efficiency", "Amdahl", "Gustafson",
    "Karp-Flatt", "straggler", "hang", "Flight Recorder", "collective timeout", "checkpoint", "resume",
    "Prometheus", "Pushgateway", "exporter", "file_sd", "Grafana", "DCGM", "MIG", "NVLink", "NVSwitch",
    "InfiniBand", "RoCE", "Slurm", "srun", "sbatch", "pyxis", "enroot", "SHARP", "NVLS", "PSS", "seat",
    "barrier", "Join", "global batch", "micro-batch", "offload", "GPUDirect", "XID", "CUDA_VISIBLE_DEVICES",
]  # fmt: skip


def entries() -> dict[str, str]:
    """The glossary's entries: each `### heading` and the text under it."""
    parts = re.split(r"^### (.+)$", GLOSSARY.read_text(), flags=re.M)
    return {heading: body.split("\n## ")[0].strip() for heading, body in zip(parts[1::2], parts[2::2], strict=True)}


@pytest.mark.parametrize("term", TERMS)
def test_the_glossary_defines_every_word_a_learner_meets(term):
    words = re.compile(rf"(?<![\w-]){re.escape(term.lower())}(?![\w-])")
    assert any(words.search(heading.lower()) for heading in entries()), f"docs/glossary.md has no entry for {term}"


def test_each_glossary_entry_is_short_and_says_where_it_is_met():
    for heading, body in entries().items():
        assert 40 < len(body) < 800, f"{heading}: {len(body)} characters; a sentence or two"
        assert re.search(r"Lessons? \d|\.md(#[\w-]+)?\)", body), f"{heading}: say which lesson or doc meets it"


def test_lesson_1_links_the_glossary_and_the_readable_ddp_script():
    text = LESSON_1.read_text()
    markdown = "\n".join(line[2:] for line in text.splitlines() if line.startswith("# "))
    links = re.findall(r"\]\(([^)#\s]+)", markdown)
    assert "../docs/glossary.md" in links, links
    assert all((LESSON_1.parent / link).exists() for link in links if not re.match(r"[a-z]+:", link)), links
    assert "torchrun --standalone --nproc-per-node 2 examples/ddp_torchrun.py --synthetic 2048 --epochs 2" in markdown
    assert "diff -u examples/single_device.py examples/ddp_torchrun.py" in markdown


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_notebook_puts_the_venv_first_on_the_servers_path():
    """A JupyterLab terminal and a `!lab ...` cell find `lab` and `torchrun` as the lessons write them."""
    dry = subprocess.run(["make", "-n", "notebook"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    server = next(line for line in dry.splitlines() if " lab --no-browser" in line)
    assert server.startswith(f'PATH="{ROOT / ".venv" / "bin"}:$PATH" '), server


def test_a_terminal_keeps_the_servers_path():
    """Started without a TTY (a room's seat, compose), JupyterLab's terminal would be a login shell, and Debian's
    /etc/profile resets PATH: the lab's server settings ask for a plain interactive shell instead."""
    config = json.loads((ROOT / "jupyter" / "config" / "jupyter_server_config.json").read_text())
    shell = config["ServerApp"]["terminado_settings"]["shell_command"]
    assert shell[0].endswith("bash") and "-l" not in shell and "--login" not in shell, shell
