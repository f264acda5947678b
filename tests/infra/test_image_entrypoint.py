"""The image keeps NGC's entry point and the base's torch (images/Dockerfile, images/entrypoint.sh).

No NGC image is reachable here: the entry point runs against a stand-in of /opt/nvidia/nvidia_entrypoint.sh (a
banner on stdout, an environment change, `exec "$@"`, as NGC's does) and a stand-in `lab`; the Dockerfile's own
Python one-liners (the frozen constraints, the requirement filter, the torch assertion) run here against this
venv's pip and stand-in torch modules. tests/infra/test_container.py builds the image for real on a CPU base.
"""

from __future__ import annotations

import json
import re
import stat
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT

DOCKERFILE = ROOT / "images" / "Dockerfile"
ENTRYPOINT = ROOT / "images" / "entrypoint.sh"


def _executable(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(stat.S_IRWXU)
    return path


def _entrypoint(tmp_path: Path, *args: str, ngc: Path | None = None) -> subprocess.CompletedProcess:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    _executable(
        bin_dir / "lab",
        '#!/bin/sh\nprintf "lab"; for a; do printf " [%s]" "$a"; done\n'
        'printf " LD_LIBRARY_PATH=%s\\n" "$LD_LIBRARY_PATH"; exit 3\n',
    )
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "LAB_NGC_ENTRYPOINT": str(ngc or tmp_path / "absent.sh")}
    return subprocess.run([str(ENTRYPOINT), *args], env=env, capture_output=True, text=True, timeout=30)


def test_ngc_entry_point_runs_first_with_its_banner_on_stderr_and_stdout_left_to_lab(tmp_path):
    ngc = _executable(
        tmp_path / "nvidia_entrypoint.sh",
        '#!/bin/bash\necho "== PyTorch == NVIDIA Release 25.01"\n'
        'export LD_LIBRARY_PATH=/usr/local/cuda/compat/lib\nexec "$@"\n',
    )
    proc = _entrypoint(tmp_path, "doctor", "--json", "-", "two words", ngc=ngc)
    assert proc.returncode == 3  # lab's own exit status: every step execs
    # stdout is lab's alone (`lab doctor --json -` must stay parseable JSON); the compat set-up reached lab
    assert proc.stdout == "lab [doctor] [--json] [-] [two words] LD_LIBRARY_PATH=/usr/local/cuda/compat/lib\n"
    assert "NVIDIA Release 25.01" in proc.stderr


def test_without_ngc_the_entry_point_is_lab(tmp_path):
    proc = _entrypoint(tmp_path, "--version")
    assert proc.returncode == 3 and proc.stdout == "lab [--version] LD_LIBRARY_PATH=\n" and proc.stderr == ""


def test_exec_runs_another_command_after_ngc_with_the_same_set_up(tmp_path):
    """compose's jupyter service: `--exec jupyter lab ...` gets NGC's CUDA set-up, then runs JupyterLab."""
    ngc = _executable(
        tmp_path / "nvidia_entrypoint.sh",
        '#!/bin/bash\necho "== PyTorch == NVIDIA Release 25.01"\n'
        'export LD_LIBRARY_PATH=/usr/local/cuda/compat/lib\nexec "$@"\n',
    )
    shown = ["sh", "-c", 'echo "jupyter $1 LD_LIBRARY_PATH=$LD_LIBRARY_PATH"; exit 4', "sh", "lab"]
    proc = _entrypoint(tmp_path, "--exec", *shown, ngc=ngc)
    assert (proc.returncode, proc.stdout) == (4, "jupyter lab LD_LIBRARY_PATH=/usr/local/cuda/compat/lib\n")
    proc = _entrypoint(tmp_path, "--exec", *shown)  # a base without NGC's script
    assert (proc.returncode, proc.stdout, proc.stderr) == (4, "jupyter lab LD_LIBRARY_PATH=\n", "")


def test_the_image_uses_the_entry_point_script():
    text = DOCKERFILE.read_text()
    assert re.search(r'^ENTRYPOINT \["/usr/local/bin/lab-entrypoint"\]$', text, re.M)
    assert re.search(r"^COPY --chown=0:0 images/entrypoint\.sh /usr/local/bin/lab-entrypoint$", text, re.M)
    assert "chmod 0755 /usr/local/bin/lab-entrypoint && lab-entrypoint --version" in text
    assert "ngc=${LAB_NGC_ENTRYPOINT:-/opt/nvidia/nvidia_entrypoint.sh}" in ENTRYPOINT.read_text()


def _one_liner(marker: str) -> str:
    """The Python of the Dockerfile's `python3 -c '...'` that contains `marker`."""
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    return next(code for code in re.findall(r"python3 -c '([^']*)'", text) if marker in code)


def test_every_install_after_the_base_runs_under_the_frozen_constraints():
    lines = DOCKERFILE.read_text().replace("\\\n", " ").splitlines()
    stages = [i for i, line in enumerate(lines) if line.startswith("FROM ")]
    base = lines[stages[0] : stages[1]]
    assert any("pip list --format=json" in line and ">/opt/lab/base-constraints.txt" in line for line in base)
    installs = [i for i, line in enumerate(lines) if "pip install" in line and i > stages[1]]
    assert installs
    for i in installs:
        for command in re.findall(r"pip install[^&|]*", lines[i]):
            assert "--constraint /opt/lab/base-constraints.txt" in command or "--no-deps" in command, command
    # the assertion on torch runs after the last install
    assertion = max(i for i, line in enumerate(lines) if '/opt/lab/base-torch.txt").read()' in line)
    assert assertion >= max(installs)


def test_the_frozen_constraints_are_name_equals_version_of_the_base():
    # what `pip list --format=json` prints in an NGC image: NGC's torch build, and a distribution's own package
    # whose version is not PEP 440 (pip would refuse it as a constraint, so it is left out)
    packages = [
        {"name": "torch", "version": "2.6.0a0+ecf3bae40a"},
        {"name": "numpy", "version": "1.26.4"},
        {"name": "python-apt", "version": "2.7.7ubuntu3"},
        {"name": "nvidia-dali-cuda120", "version": "1.45.0"},
    ]
    out = subprocess.run(
        [sys.executable, "-c", _one_liner("VERSION_PATTERN")],
        input=json.dumps(packages),
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert out == ["torch==2.6.0a0+ecf3bae40a", "numpy==1.26.4", "nvidia-dali-cuda120==1.45.0"]
    from pip._vendor.packaging.requirements import Requirement

    assert [str(Requirement(line).specifier) for line in out] == ["==2.6.0a0+ecf3bae40a", "==1.26.4", "==1.45.0"]


def test_torch_and_torchvision_are_not_asked_for_again():
    code = _one_liner("Requirement(r).name").replace("/tmp/lab/pyproject.toml", str(ROOT / "pyproject.toml"))
    wanted = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert wanted and not any(re.match(r"torch(vision)?\b", r) for r in wanted)
    assert any(r.startswith("nvidia-ml-py") for r in wanted) and any(r.startswith("numpy") for r in wanted)


def test_the_build_fails_when_the_install_moved_torch(tmp_path):
    (tmp_path / "torch.py").write_text('__version__ = "2.6.0a0+ecf3bae40a"\n')  # stand-ins: no torch import
    (tmp_path / "torchvision.py").write_text('__version__ = "0.21.0a0"\n')
    code = _one_liner('base-torch.txt").read()').replace("/opt/lab/base-torch.txt", str(tmp_path / "base-torch.txt"))

    def check(recorded: str) -> subprocess.CompletedProcess:
        (tmp_path / "base-torch.txt").write_text(recorded + "\n")
        return subprocess.run(
            [sys.executable, "-c", code],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            env={"PYTHONPATH": str(tmp_path)},
        )

    assert check("2.6.0a0+ecf3bae40a 0.21.0a0").returncode == 0
    moved = check("2.6.0a0+ecf3bae40a 0.20.0")
    assert moved.returncode == 1 and moved.stderr.strip() == (
        "the lab install changed the base torch, torchvision: 2.6.0a0+ecf3bae40a 0.20.0 before, "
        "2.6.0a0+ecf3bae40a 0.21.0a0 after"
    )
