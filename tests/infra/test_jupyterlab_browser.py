"""JupyterLab from the venv, opened by a real browser (Debian's chromium, headless) with the token the server
printed, as a learner does with `make notebook`: lesson 1 must load as a notebook, its text rendered and every
code cell shown, with no error dialog and no uncaught JavaScript error. Where it fails, a screenshot of the page
is kept in build/test-artifacts/ for the CI log's reader.

chromium comes from scripts/install-test-tools.sh (Debian's package); the test skips without it, and fails
instead where CI=true."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from html.parser import HTMLParser
from pathlib import Path

import pytest

from lab.course.teaching.lesson import free_ports
from tests.conftest import PYTHON, ROOT

BIN = Path(PYTHON).parent
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ARTIFACTS = ROOT / "build" / "test-artifacts"
LESSON = "01_baseline_and_ddp"


class Page(HTMLParser):
    """The rendered page's elements by class, and the text inside its notebook (styles and scripts left out)."""

    def __init__(self) -> None:
        super().__init__()
        self.classes: list[set[str]] = []
        self.text: list[str] = []
        self._skip = 0

    def handle_starttag(self, tag, attrs):
        if tag in ("style", "script"):
            self._skip += 1
        self.classes.append(set((dict(attrs).get("class") or "").split()))

    def handle_endtag(self, tag):
        if tag in ("style", "script"):
            self._skip -= 1

    def handle_data(self, data):
        if not self._skip and data.strip():
            self.text.append(data.strip())

    def count(self, cls: str) -> int:
        return sum(cls in c for c in self.classes)


def _browse(url: str, *extra: str) -> subprocess.CompletedProcess:
    # virtual time: the page's timers run until JupyterLab has loaded, however slow the machine
    assert CHROMIUM is not None  # the test skips before it browses without one
    return subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--enable-logging=stderr",
            "--v=0",
            "--virtual-time-budget=30000",
            *extra,
            url,
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )


@pytest.fixture
def jupyterlab(tmp_path):
    if CHROMIUM is None:
        if os.environ.get("CI") == "true":
            pytest.fail("chromium missing: scripts/install-test-tools.sh installs it (Debian's package)")
        pytest.skip("chromium not installed (scripts/install-test-tools.sh installs it as root on Debian)")
    # The lessons as `make notebook` serves them: paired .py files, .ipynb made by jupytext (here in a copy)
    notebooks = tmp_path / "notebooks"
    shutil.copytree(ROOT / "notebooks", notebooks)
    subprocess.run(
        [str(BIN / "jupytext"), "--sync", *map(str, sorted(notebooks.glob("[0-9]*.py")))],
        check=True,
        capture_output=True,
        timeout=120,
    )
    port = free_ports()
    log = tmp_path / "jupyter.log"
    root = ["--allow-root"] if os.geteuid() == 0 else []  # CI runs as root
    with log.open("w") as out:
        server = subprocess.Popen(
            [
                str(BIN / "jupyter"),
                "lab",
                "--no-browser",
                "--ip=127.0.0.1",
                f"--port={port}",
                f"--ServerApp.root_dir={tmp_path}",
                *root,
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime")},
        )
    try:
        deadline = time.monotonic() + 120  # a hang guard: the server prints its address within seconds
        while not (found := re.search(rf"http://127\.0\.0\.1:{port}/lab\?token=([0-9a-f]+)", log.read_text())):
            assert server.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.5)
        yield f"http://127.0.0.1:{port}", found.group(1), log
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_lesson_one_opens_in_jupyterlab_with_the_printed_token(jupyterlab):
    import jupytext

    base, token, log = jupyterlab
    url = f"{base}/lab/tree/notebooks/{LESSON}.ipynb?token={token}"
    proc = _browse(url, "--dump-dom")
    page = Page()
    page.feed(proc.stdout)
    cells = jupytext.read(ROOT / "notebooks" / f"{LESSON}.py").cells
    problems = []
    if page.count("jp-NotebookPanel") != 1:
        problems.append("no notebook panel")
    if page.count("jp-Dialog"):
        problems.append("an error dialog: " + " ".join(page.text)[-500:])
    if page.count("jp-CodeCell") != sum(c.cell_type == "code" for c in cells):
        problems.append(f"{page.count('jp-CodeCell')} code cells shown of {sum(c.cell_type == 'code' for c in cells)}")
    if "Lesson 1: the baseline and DDP at one global batch" not in page.text:
        problems.append("the lesson's title is not rendered")
    if "Python 3 (ipykernel)" not in " ".join(page.text):
        problems.append("no kernel named on the toolbar")
    uncaught = [line for line in proc.stderr.splitlines() if "Uncaught" in line]
    problems += uncaught
    if problems:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        shot = ARTIFACTS / f"jupyterlab-{LESSON}.png"
        _browse(url, f"--screenshot={shot}", "--window-size=1400,1000")
        pytest.fail(f"{problems}; screenshot: {shot}; server log: {log.read_text()[-2000:]}")
    # without the token the server refuses the API: the page above got in by the token alone
    import urllib.error
    import urllib.request

    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"{base}/api/contents/notebooks", timeout=30)
    assert refused.value.code == 403
